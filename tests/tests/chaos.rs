//! The short chaos run of `make test` (about two minutes: a few hundred claims, three
//! leader kills, one kube-apiserver restart). `make chaos` runs the long one.

use address_controller_tests::chaos::{Config, run};

#[tokio::test]
async fn the_ledger_survives_churn_leader_kills_and_an_apiserver_restart() {
    let outcome = run(&Config::short()).await.expect("the chaos run");
    println!("{}", outcome.summary());
    let s = &outcome.stats;
    let n = |a: &std::sync::atomic::AtomicUsize| a.load(std::sync::atomic::Ordering::Relaxed);
    // The disruptions happened (positive controls), and the ledger is sound.
    assert!(
        n(&s.claims_created) >= 100,
        "claims created: {}",
        n(&s.claims_created)
    );
    assert!(
        n(&s.claims_deleted) >= 50,
        "claims deleted: {}",
        n(&s.claims_deleted)
    );
    assert!(
        n(&s.leader_kills) >= 3,
        "leader kills: {}",
        n(&s.leader_kills)
    );
    assert_eq!(n(&s.apiserver_restarts), 1);
    assert!(
        outcome
            .association_events
            .get("Service/Associated")
            .is_some_and(|n| *n > 0),
        "the driver put addresses on Services: {:?}",
        outcome.association_events
    );
    // The hostile tenant acted (its wins, if any, fail `ok`).
    assert!(
        n(&s.self_owned_claims) >= 1 && n(&s.forged_thieves) + n(&s.foreign_pins) >= 1,
        "the hostile tenant did nothing: {}",
        outcome.summary()
    );
    assert!(outcome.ok(), "{}", outcome.summary());
}
