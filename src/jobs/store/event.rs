//! The events instances sharing a PostgreSQL store tell each other (see `notify`), and their
//! `NOTIFY` payloads.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Queued,
    Canceled(String),
    Succeeded(String),
    Deleted(String),
}

impl Event {
    pub fn payload(&self) -> String {
        match self {
            Event::Queued => "queued".into(),
            Event::Canceled(id) => format!("canceled:{id}"),
            Event::Succeeded(id) => format!("succeeded:{id}"),
            Event::Deleted(id) => format!("deleted:{id}"),
        }
    }

    pub fn parse(payload: &str) -> Option<Event> {
        if payload == "queued" {
            return Some(Event::Queued);
        }
        let (kind, id) = payload.split_once(':')?;
        let id = id.to_string();
        match kind {
            "canceled" => Some(Event::Canceled(id)),
            "succeeded" => Some(Event::Succeeded(id)),
            "deleted" => Some(Event::Deleted(id)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip() {
        for e in [Event::Queued, Event::Canceled("a".into()), Event::Succeeded("b".into()), Event::Deleted("c".into())] {
            assert_eq!(Event::parse(&e.payload()), Some(e));
        }
        assert_eq!(Event::parse("bogus:x"), None);
        assert_eq!(Event::parse("succeeded"), None);
    }
}
