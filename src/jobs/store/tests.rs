//! The job store's behaviour, one body per property, run on SQLite and PostgreSQL (`each_store`).

use std::collections::BTreeMap;
use std::time::Duration;

use super::notify::Event;
use super::testing::{each_store, FreshPostgres};
use super::{Dialect, Inserted, JobStore, Lease, NewBatch};
use crate::jobs::model::BatchPhase;
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

/// A pooled batch's members: inserted together, claimed for their statistics in the batch's order,
/// not claimable between their two runs until the batch has its system, then claimed again; a lost
/// member is found as breaking its batch, and failing the batch fails the members left.
#[tokio::test]
async fn pooled_members_wait_for_their_batch_system() {
    each_store(|s| async move {
        let lease = Lease { owner: "a".into(), duration: Duration::from_secs(60) };
        let batch = NewBatch { id: uuid::Uuid::now_v7().to_string(), owner: "alice".into(), pooled: true, params: "{}".into() };
        let members: Vec<NewJob> = (0..3).map(|_| NewJob::for_test(&uuid::Uuid::now_v7().to_string())).collect();
        let row = s.insert_batch(&batch, &members).await.unwrap();
        assert_eq!((row.inputs, row.pooled, row.system_key.clone()), (3, true, None));
        let jobs = s.batch_jobs(&batch.id).await.unwrap();
        assert_eq!(jobs.iter().map(|j| j.id.clone()).collect::<Vec<_>>(), members.iter().map(|m| m.id.clone()).collect::<Vec<_>>());
        // Statistics runs, in order.
        for (i, m) in members.iter().enumerate() {
            let j = s.claim(&lease).await.unwrap().expect("a statistics run");
            assert_eq!(j.id, m.id);
            let b = j.batch.clone().unwrap();
            assert_eq!((b.position, b.phase), (i as i64, Some(BatchPhase::Statistics)));
            assert!(s.statistics_done(&j.id, "a").await.unwrap());
            assert!(!s.statistics_done(&j.id, "a").await.unwrap(), "once");
        }
        // All waiting for the system: nothing to claim, and the batch awaits its system.
        assert!(s.claim(&lease).await.unwrap().is_none());
        let awaiting = s.batches_awaiting_system().await.unwrap();
        assert_eq!(awaiting.iter().map(|b| b.id.as_str()).collect::<Vec<_>>(), [batch.id.as_str()]);
        assert!(s.set_batch_system(&batch.id, "batches/x/system").await.unwrap());
        assert!(!s.set_batch_system(&batch.id, "batches/x/other").await.unwrap(), "the first system stays");
        assert!(s.batches_awaiting_system().await.unwrap().is_empty());
        for m in &members {
            let j = s.claim(&lease).await.unwrap().expect("a projection run");
            assert_eq!((j.id.as_str(), j.batch.unwrap().phase), (m.id.as_str(), Some(BatchPhase::Project)));
        }

        // A second batch loses a member before its system: it is found broken, and failing it fails
        // the members left.
        let batch2 = NewBatch { id: uuid::Uuid::now_v7().to_string(), owner: "alice".into(), pooled: true, params: "{}".into() };
        let members2: Vec<NewJob> = (0..2).map(|_| NewJob::for_test(&uuid::Uuid::now_v7().to_string())).collect();
        s.insert_batch(&batch2, &members2).await.unwrap();
        assert!(s.cancel(&members2[1].id).await.unwrap());
        let broken = s.broken_batches().await.unwrap();
        assert_eq!(broken.len(), 1);
        assert_eq!((broken[0].0.id.as_str(), broken[0].1, broken[0].2.as_str()), (batch2.id.as_str(), 1, "canceled"));
        assert_eq!(s.fail_batch(&batch2.id, "batch_failed", "input 1 was canceled").await.unwrap(), vec![members2[0].id.clone()]);
        assert!(s.broken_batches().await.unwrap().is_empty());
        let j = s.get(&members2[0].id).await.unwrap().unwrap();
        assert_eq!((j.status, j.error_code.as_deref()), (JobStatus::Failed, Some("batch_failed")));
        assert_eq!(s.get_batch(&batch2.id).await.unwrap().unwrap().error_code.as_deref(), Some("batch_failed"));
        assert_eq!(s.list_batches("alice", 10, None).await.unwrap().len(), 2);
        assert!(s.list_batches("bob", 10, None).await.unwrap().is_empty());
        assert!(s.delete_batch(&batch2.id).await.unwrap());
        assert!(s.get_batch(&batch2.id).await.unwrap().is_none());
    })
    .await;
}

/// Imported systems' rows (`POST /v1/systems`): stored, found by id, listed per owner newest first,
/// deleted once.
#[tokio::test]
async fn imported_systems_are_stored_listed_per_owner_and_deleted() {
    each_store(|s| async move {
        let row = |id: &str, owner: &str, at: i64| super::SystemRow {
            id: id.into(),
            owner: owner.into(),
            identity: format!("identity-{id}"),
            bands: 425,
            bands_used: 400,
            storage_key: format!("systems/{id}/system.json"),
            bytes: 3_900_000,
            created_at: at,
        };
        for r in [row("s1", "alice", 1), row("s2", "alice", 2), row("s3", "bob", 3)] {
            s.insert_system(&r).await.unwrap();
        }
        assert!(s.insert_system(&row("s1", "alice", 4)).await.is_err(), "an id names one system");
        assert_eq!(s.get_system("s2").await.unwrap(), Some(row("s2", "alice", 2)));
        assert_eq!(s.get_system("none").await.unwrap(), None);
        let ids = |rows: Vec<super::SystemRow>| rows.into_iter().map(|r| r.id).collect::<Vec<_>>();
        assert_eq!(ids(s.list_systems("alice", 10).await.unwrap()), ["s2", "s1"]);
        assert_eq!(ids(s.list_systems("alice", 1).await.unwrap()), ["s2"]);
        assert_eq!(ids(s.list_systems("bob", 10).await.unwrap()), ["s3"]);
        assert!(s.delete_system("s2").await.unwrap());
        assert!(!s.delete_system("s2").await.unwrap(), "once");
        assert_eq!(ids(s.list_systems("alice", 10).await.unwrap()), ["s1"]);
    })
    .await;
}

/// The reference memo: a digest recorded per objects and versions, replaced when read again.
#[tokio::test]
async fn the_reference_memo_records_and_replaces_a_digest() {
    each_store(|s| async move {
        let key = r#"{"href":"s3://b/a.npy","size":10,"etag":"\"e1\""}"#;
        assert_eq!(s.find_reference(key).await.unwrap(), None);
        s.remember_reference(key, "c1", None).await.unwrap();
        assert_eq!(s.find_reference(key).await.unwrap(), Some(super::reference_rows::ReferenceDigest { content: "c1".into(), carried: None }));
        // Read again (by another job): the row is replaced, not duplicated.
        s.remember_reference(key, "c2", Some("m2")).await.unwrap();
        assert_eq!(s.find_reference(key).await.unwrap(), Some(super::reference_rows::ReferenceDigest { content: "c2".into(), carried: Some("m2".into()) }));
        assert_eq!(s.find_reference(&key.replace("e1", "e2")).await.unwrap(), None, "another version is another key");
    })
    .await;
}
