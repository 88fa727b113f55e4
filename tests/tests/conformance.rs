//! The range driver passes the driver conformance suite (the `driver-conformance` crate), with every
//! case run: nothing skipped.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use address_controller_tests::ControllerProcess;
use address_controller_tests::conformance::{Options, Restart, run};
use address_controller_tests::env::{env, purge, range_class};
use serde_json::json;
use tokio::sync::Mutex;

#[tokio::test]
async fn the_range_driver_passes_the_driver_conformance_suite() {
    let mut e = env("conformance").await;
    purge(
        &e,
        &[
            "198.18.60.",
            "198.18.61.",
            "198.18.62.",
            "2001:db8:60::",
            "2001:db8:62::",
        ],
    )
    .await;
    let class = range_class(
        &mut e,
        "conf",
        json!(["198.18.60.0/29", "2001:db8:60::/125"]),
        json!({}),
    )
    .await;
    // A pause between deciding and creating makes "restart mid-provision" and "race with
    // the core" land in the window they are about, every time.
    let driver = Arc::new(Mutex::new(
        ControllerProcess::driver(
            &format!("drv-conf-{}", e.sfx),
            &[
                "--lease-name",
                &format!("drv-conf-{}", e.sfx),
                "--testing-create-delay",
                "1500ms",
            ],
        )
        .await
        .unwrap(),
    ));
    let restarts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let restart: Restart = {
        let (driver, restarts) = (driver.clone(), restarts.clone());
        Box::new(move || {
            let (driver, restarts) = (driver.clone(), restarts.clone());
            Box::pin(async move {
                // Mid-provision: the claims are queued; kill inside the create pause.
                tokio::time::sleep(Duration::from_millis(700)).await;
                driver.lock().await.restart().await?;
                restarts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            })
        })
    };
    let report = run(
        &e.client,
        &Options {
            class: class.clone(),
            invalid_parameters: Some(json!({"cidrs": "not a list"})),
            restart: Some(restart),
            race_address: Some("198.18.61.1".into()),
            timeout: Duration::from_secs(60),
            lose_parameters: Some(json!({"cidrs": ["198.18.62.0/29", "2001:db8:62::/125"]})),
            associate: true,
            service_class: None,
        },
    )
    .await
    .unwrap();
    println!("{}", report.table());
    assert!(report.ok(), "{}", report.table());
    let skipped: Vec<_> = report
        .cases
        .iter()
        .filter(|c| c.skipped.is_some())
        .collect();
    assert!(skipped.is_empty(), "every case runs here: {skipped:?}");
    assert_eq!(restarts.load(std::sync::atomic::Ordering::Relaxed), 1);
    // The restart landed mid-provision (the case says so, or it would have been skipped).
    let restart = report
        .cases
        .iter()
        .find(|c| c.case == "restart-mid-provision")
        .unwrap();
    assert!(
        restart
            .note
            .as_deref()
            .is_some_and(|n| n.contains("not yet provisioned")),
        "{restart:?}"
    );
    // The pause makes the race land as it did in the field: the driver's create after the
    // core's bind.
    let race = report
        .cases
        .iter()
        .find(|c| c.case == "race-with-the-core")
        .unwrap();
    assert!(
        race.note
            .as_deref()
            .is_some_and(|n| n.contains("released as surplus")),
        "{race:?}"
    );
    let d = driver.lock().await;
    assert!(
        d.log_contains("provisioned"),
        "the driver under test did the provisioning"
    );
    drop(d);
    e.check().await;
}
