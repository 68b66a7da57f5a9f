//! The job store's two databases and the few SQL clauses that differ between them.

/// Which database a store runs on: the few clauses that differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    pub fn of_url(url: &str) -> Option<Dialect> {
        if url.starts_with("sqlite:") {
            Some(Dialect::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(Dialect::Postgres)
        } else {
            None
        }
    }

    /// For queries whose condition differs by database (`$n = 'sqlite' OR ...`).
    pub(super) fn name(self) -> &'static str {
        match self {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
        }
    }

    /// The column that is a job's result-level handle: SQLite's implicit rowid, PostgreSQL's `seq`.
    pub(super) fn handle_column(self) -> &'static str {
        match self {
            Dialect::Sqlite => "rowid",
            Dialect::Postgres => "seq",
        }
    }

    /// Row locking for the claim's subquery: PostgreSQL skips rows another instance is claiming;
    /// SQLite serialises writers, so the subquery and the update are one atomic step already.
    pub(super) fn skip_locked(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => "FOR UPDATE SKIP LOCKED",
        }
    }
}
