//! The job store's behaviour, one body per property, run on SQLite and PostgreSQL (`each_store`).

use std::collections::BTreeMap;
use std::time::Duration;

use super::notify::Event;
use super::testing::{each_store, FreshPostgres};
use super::{Dialect, Inserted, JobStore, Lease};
use crate::jobs::{JobStatus, NewJob};

fn lease(owner: &str, secs: u64) -> Lease {
    Lease { owner: owner.into(), duration: Duration::from_secs(secs) }
}

/// A lease that has already run out when the claim returns.
fn expired(owner: &str) -> Lease {
    Lease { owner: owner.into(), duration: Duration::ZERO }
}

#[tokio::test]
async fn a_job_goes_from_queued_to_succeeded_once() {
    each_store(|s| async move {
        let Inserted::Created(j) = s.insert(NewJob::for_test("j1")).await.unwrap() else { panic!("created") };
        assert_eq!((j.status, j.attempts, j.progress), (JobStatus::Queued, 0, 0.0));
        let mut again = NewJob::for_test("j1-again");
        again.digest = j.digest.clone();
        let Inserted::Existing(e) = s.insert(again).await.unwrap() else { panic!("the same digest is the same job") };
        assert_eq!(e.id, "j1");

        let c = s.claim(&lease("a", 30)).await.unwrap().expect("the queued job");
        assert_eq!((c.id.as_str(), c.status, c.attempts, c.stage.as_deref()), ("j1", JobStatus::Running, 1, Some("read")));
        assert!(s.claim(&lease("b", 30)).await.unwrap().is_none(), "a running job under a live lease is not claimed");
        assert!(s.heartbeat("j1", &lease("a", 30)).await.unwrap());
        assert!(!s.heartbeat("j1", &lease("b", 30)).await.unwrap(), "only the holder extends a lease");
        s.progress("j1", "statistics", 0.25).await.unwrap();
        assert_eq!(s.get("j1").await.unwrap().unwrap().progress, 0.25);

        let results = BTreeMap::from([("components.npy".to_string(), "results/j1/components.npy".to_string())]);
        assert!(!s.succeed("j1", "b", &results, false).await.unwrap(), "only the holder records the outcome");
        assert!(s.succeed("j1", "a", &results, false).await.unwrap());
        assert!(!s.succeed("j1", "a", &results, false).await.unwrap(), "once");
        let done = s.get("j1").await.unwrap().unwrap();
        assert_eq!((done.status, done.progress, done.results), (JobStatus::Succeeded, 1.0, results));
        assert!(done.finished_at.is_some());
        let (handle, owner, digest) = s.succeeded_cache_entry("j1").await.unwrap().unwrap();
        assert_eq!((Some(handle), owner.as_str(), digest), (s.rowid_of("j1").await.unwrap(), "alice", done.digest.clone()));

        let counts = s.count_by_status().await.unwrap();
        assert!(counts.contains(&(JobStatus::Succeeded, 1)) && counts.contains(&(JobStatus::Queued, 0)));
        assert!(s.delete("j1").await.unwrap());
        assert!(s.get("j1").await.unwrap().is_none());
        assert!(!s.delete("j1").await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn a_job_whose_lease_ran_out_is_claimed_again_and_the_old_holder_loses_it() {
    each_store(|s| async move {
        s.insert(NewJob::for_test("j1")).await.unwrap();
        let first = s.claim(&expired("dead")).await.unwrap().unwrap();
        assert_eq!(first.attempts, 1);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let second = s.claim(&lease("alive", 30)).await.unwrap().expect("the expired claim is taken over");
        assert_eq!((second.id.as_str(), second.attempts), ("j1", 2));
        assert!(!s.heartbeat("j1", &lease("dead", 30)).await.unwrap(), "the old holder's heartbeat fails");
        assert!(!s.fail("j1", "dead", "x", "y").await.unwrap(), "and it cannot record an outcome");
        assert!(s.succeed("j1", "alive", &BTreeMap::new(), false).await.unwrap());
        assert!(s.claim(&lease("c", 30)).await.unwrap().is_none());
    })
    .await;
}

#[tokio::test]
async fn concurrent_claims_take_each_job_once() {
    each_store(|s| async move {
        for i in 0..24 {
            s.insert(NewJob::for_test(&format!("j{i:02}"))).await.unwrap();
        }
        let claimers = (0..6).map(|w| {
            let s = s.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                while let Some(j) = s.claim(&lease(&format!("w{w}"), 30)).await.unwrap() {
                    got.push(j.id);
                }
                got
            })
        });
        let mut all: Vec<String> = Vec::new();
        for c in claimers.collect::<Vec<_>>() {
            all.extend(c.await.unwrap());
        }
        all.sort();
        let expected: Vec<String> = (0..24).map(|i| format!("j{i:02}")).collect();
        assert_eq!(all, expected, "every job claimed exactly once");
    })
    .await;
}

#[tokio::test]
async fn cancel_stops_the_holder_and_list_filters() {
    each_store(|s| async move {
        s.insert(NewJob::for_test("a1")).await.unwrap();
        s.insert(NewJob::for_test("a2")).await.unwrap();
        let mut bob = NewJob::for_test("b1");
        bob.owner = "bob".into();
        s.insert(bob).await.unwrap();
        let running = s.claim(&lease("w", 30)).await.unwrap().unwrap();
        assert!(s.cancel(&running.id).await.unwrap());
        assert!(!s.cancel(&running.id).await.unwrap(), "already finished");
        assert!(!s.heartbeat(&running.id, &lease("w", 30)).await.unwrap());
        assert!(!s.succeed(&running.id, "w", &BTreeMap::new(), false).await.unwrap());
        assert_eq!(s.get(&running.id).await.unwrap().unwrap().status, JobStatus::Canceled);

        let alice: Vec<String> = s.list("alice", None, 10, None).await.unwrap().into_iter().map(|j| j.id).collect();
        assert_eq!(alice, ["a2", "a1"], "newest first, the owner's only");
        let queued: Vec<String> = s.list("alice", Some(JobStatus::Queued), 10, None).await.unwrap().into_iter().map(|j| j.id).collect();
        assert_eq!(queued, ["a2"]);
        let older: Vec<String> = s.list("alice", None, 10, Some("a2")).await.unwrap().into_iter().map(|j| j.id).collect();
        assert_eq!(older, ["a1"]);
        assert_eq!(s.list("bob", None, 10, None).await.unwrap().len(), 1);
    })
    .await;
}

#[tokio::test]
async fn a_restarted_instance_requeues_its_own_running_jobs() {
    each_store(|s| async move {
        s.insert(NewJob::for_test("mine")).await.unwrap();
        s.insert(NewJob::for_test("theirs")).await.unwrap();
        s.claim(&lease("me", 30)).await.unwrap().unwrap();
        s.claim(&lease("other", 30)).await.unwrap().unwrap();
        let n = s.requeue_running("me").await.unwrap();
        let status = |id: &'static str| {
            let s = s.clone();
            async move { s.get(id).await.unwrap().unwrap().status }
        };
        assert_eq!(status("mine").await, JobStatus::Queued);
        match s.dialect() {
            // One process owns an SQLite file: whatever was running is its own.
            Dialect::Sqlite => assert_eq!((n, status("theirs").await), (2, JobStatus::Queued)),
            // Another instance's job stays its own until its lease runs out.
            Dialect::Postgres => assert_eq!((n, status("theirs").await), (1, JobStatus::Running)),
        }
    })
    .await;
}

async fn next(listener: &mut sqlx::postgres::PgListener) -> Event {
    let n = tokio::time::timeout(Duration::from_secs(10), listener.recv()).await.expect("a notification").unwrap();
    Event::parse(n.payload()).expect("a known payload")
}

/// PostgreSQL only: another instance hears of queued, canceled, succeeded and deleted jobs.
#[tokio::test]
async fn instances_hear_each_other() {
    let Some(pg) = FreshPostgres::create().await else { return };
    let a = JobStore::open(&pg.url).await.unwrap();
    let b = JobStore::open(&pg.url).await.unwrap();
    let mut listener = b.listen().await.unwrap().expect("a listener on PostgreSQL");
    a.insert(NewJob::for_test("j1")).await.unwrap();
    assert_eq!(next(&mut listener).await, Event::Queued);
    a.claim(&lease("a", 30)).await.unwrap().unwrap();
    a.succeed("j1", "a", &BTreeMap::new(), false).await.unwrap();
    assert_eq!(next(&mut listener).await, Event::Succeeded("j1".into()));
    a.delete("j1").await.unwrap();
    assert_eq!(next(&mut listener).await, Event::Deleted("j1".into()));
    a.insert(NewJob::for_test("j2")).await.unwrap();
    assert_eq!(next(&mut listener).await, Event::Queued);
    a.cancel("j2").await.unwrap();
    assert_eq!(next(&mut listener).await, Event::Canceled("j2".into()));
    drop((a, b));
    pg.drop_database().await;
}

#[tokio::test]
async fn unsupported_urls_are_refused_clearly() {
    let e = JobStore::open("mysql://x/y").await.err().expect("refused");
    assert!(e.to_string().contains("postgres://"), "{e}");
}

/// Results marked unsynced are listed for the instance that ran the job (on PostgreSQL; every such
/// job on SQLite) until marked synced; a job whose results were lost goes back to the queue, or
/// fails when it has no input, and either way leaves the list and its results.
#[tokio::test]
async fn unsynced_results_are_listed_until_synced_and_lost_ones_are_queued_again_or_failed() {
    each_store(|s| async move {
        let results = BTreeMap::from([("components.npy".to_string(), "results/x/components.npy".to_string())]);
        for (id, holder) in [("mine", "a"), ("theirs", "b"), ("synced", "a")] {
            s.insert(NewJob::for_test(id)).await.unwrap();
            let c = s.claim(&lease(holder, 30)).await.unwrap().unwrap();
            assert_eq!(c.id, id);
            assert!(s.succeed(id, holder, &results, id != "synced").await.unwrap());
        }
        let Inserted::Created(r) = s.insert_succeeded(NewJob::for_test("resident"), &results, "a", true).await.unwrap() else {
            panic!("created")
        };
        assert!(r.results_unsynced && r.status == JobStatus::Succeeded);
        let listed = |v: Vec<crate::jobs::Job>| v.into_iter().map(|j| j.id).collect::<Vec<_>>();
        let want: Vec<&str> = match s.dialect() {
            Dialect::Sqlite => vec!["mine", "resident", "theirs"],
            Dialect::Postgres => vec!["mine", "resident"],
        };
        assert_eq!(listed(s.unsynced_results("a").await.unwrap()), want);

        s.results_synced("theirs").await.unwrap();
        assert!(!s.get("theirs").await.unwrap().unwrap().results_unsynced);
        assert!(s.requeue_lost("mine").await.unwrap());
        let again = s.get("mine").await.unwrap().unwrap();
        assert_eq!((again.status, again.results.len(), again.finished_at, again.results_unsynced), (JobStatus::Queued, 0, None, false));
        assert_eq!(s.claim(&lease("a", 30)).await.unwrap().map(|j| (j.id, j.attempts)), Some(("mine".to_string(), 2)));
        assert!(s.fail_lost("resident", "result_lost", "gone").await.unwrap());
        let lost = s.get("resident").await.unwrap().unwrap();
        assert_eq!((lost.status, lost.error_code.as_deref(), lost.results.len()), (JobStatus::Failed, Some("result_lost"), 0));
        assert!(!s.fail_lost("synced", "x", "y").await.unwrap(), "results on the disk are not lost");
        assert!(s.unsynced_results("a").await.unwrap().is_empty());
        // Only succeeded jobs are taken back.
        assert!(!s.requeue_lost("resident").await.unwrap(), "a failed job is not requeued");
    })
    .await;
}

#[tokio::test]
async fn the_reference_memo_records_and_replaces_a_digest() {
    each_store(|s| async move {
        let key = r#"{"href":"s3://b/a.npy","size":10,"etag":"\"e1\""}"#;
        assert_eq!(s.find_reference(key).await.unwrap(), None);
        s.remember_reference(key, "c1", None).await.unwrap();
        assert_eq!(s.find_reference(key).await.unwrap(), Some(super::ReferenceDigest { content: "c1".into(), carried: None }));
        // Read again (by another job): the row is replaced, not duplicated.
        s.remember_reference(key, "c2", Some("m2")).await.unwrap();
        assert_eq!(s.find_reference(key).await.unwrap(), Some(super::ReferenceDigest { content: "c2".into(), carried: Some("m2".into()) }));
        assert_eq!(s.find_reference(&key.replace("e1", "e2")).await.unwrap(), None, "another version is another key");
    })
    .await;
}
