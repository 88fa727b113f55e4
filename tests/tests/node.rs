//! The chart on a real node: the project's image imported into a containerd, the chart
//! installed with `helm upgrade --install`, pods scheduled, started, probed, rolled out
//! and restarted by a kubelet (deploy/local/node.sh; root only — skipped with the reason
//! printed otherwise). Each test prints its figures as `figure: ...` lines.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use address_controller_api::{IPAddressClaim, IPAddressClass};
use address_controller_tests::env::tempdir;
use address_controller_tests::image::{container_argv, proc_status, proc_strings};
use address_controller_tests::invariants::{Scope, assert_invariants};
use address_controller_tests::node::{
    self, CONTROLLER, DRIVER, NAMESPACE, Node, container_pid, file_fingerprint, pod_ip, pod_name,
    replicas, restarts, served_fingerprint, until,
};
use address_controller_tests::{Cleanup, TestNamespace, random_suffix, wait_for};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const LEASE: &str = "address-controller";

/// The invariant checker over the whole node cluster (its tests run one at a time, so
/// everything on it is theirs), with every controller replica's gauges.
async fn check_everything(node: &Node) {
    let client = node.cluster.client().await.unwrap();
    assert_invariants(&client, &Scope::everything(), &replicas(node)).await;
}

/// A tenant of one test: a namespace, a range class of its own, its claims.
struct Tenant {
    client: Client,
    ns: TestNamespace,
    class: String,
    _cleanup: Cleanup,
}

impl Tenant {
    async fn new(client: &Client, prefix: &str, cidr: &str) -> Tenant {
        let ns = TestNamespace::create(client, prefix).await.unwrap();
        let class = format!("{prefix}-{}", random_suffix());
        let classes: Api<IPAddressClass> = Api::all(client.clone());
        classes
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": class},
                    "spec": {"provisioner": "range.drivers.local.sdn.cozystack.io",
                             "reclaimPolicy": "Delete", "parameters": {"cidrs": [cidr]}}
                }))
                .unwrap(),
            )
            .await
            .unwrap();
        let mut cleanup = Cleanup::default();
        cleanup.add("ipaddressclasses.local.sdn.cozystack.io", &class);
        Tenant {
            client: client.clone(),
            ns,
            class,
            _cleanup: cleanup,
        }
    }

    fn claims(&self) -> Api<IPAddressClaim> {
        Api::namespaced(self.client.clone(), &self.ns.name)
    }

    /// Creates a claim of the tenant's class and waits until it is Bound; its address.
    async fn bound_claim(&self, name: &str, timeout: Duration) -> String {
        self.claims()
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": name}, "spec": {"className": self.class}
                }))
                .unwrap(),
            )
            .await
            .unwrap();
        let api = self.claims();
        wait_for(&format!("claim {name} Bound"), timeout, || {
            let api = api.clone();
            async move {
                let c = api.get(name).await?;
                let st = c.status.unwrap_or_default();
                Ok(
                    (st.phase.map(|p| format!("{p:?}")).as_deref() == Some("Bound"))
                        .then(|| st.addresses.first().map(|a| a.address.clone()))
                        .flatten(),
                )
            }
        })
        .await
        .unwrap()
    }

    async fn check(&self, node: &Node) {
        assert_invariants(
            &self.client,
            &Scope::of(&[self.ns.name.as_str()], &[self.class.as_str()]),
            &replicas(node),
        )
        .await;
    }
}

/// Requests to the aggregated views, made without retries while something happens to the
/// pods serving them: every answer that is not a 200, and every moment the APIService is
/// not Available, counts.
struct Watcher {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<(Vec<String>, u64)>,
}

impl Watcher {
    async fn start(node: &Node) -> Watcher {
        let client = node.cluster.raw_client().await.unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let (stop, ok) = (stop.clone(), ok.clone());
            async move {
                let mut errors = Vec::new();
                let mut unavailable = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let list = http::Request::get(
                        "/apis/view.local.sdn.cozystack.io/v1alpha1/namespaceaddresses",
                    )
                    .body(Vec::new())
                    .unwrap();
                    match client.request_text(list).await {
                        Ok(_) => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => errors.push(format!("{:?} list: {e}", Instant::now())),
                    }
                    let get = http::Request::get(
                        "/apis/apiregistration.k8s.io/v1/apiservices/v1alpha1.view.local.sdn.cozystack.io",
                    )
                    .body(Vec::new())
                    .unwrap();
                    if let Ok(a) = client.request::<Value>(get).await {
                        let available = a["status"]["conditions"].as_array().is_some_and(|cs| {
                            cs.iter()
                                .any(|c| c["type"] == "Available" && c["status"] == "True")
                        });
                        if !available {
                            unavailable += 1;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                (errors, unavailable)
            }
        });
        Watcher { stop, ok, task }
    }

    /// Waits until `n` more lists have been answered (the watcher has been asking before
    /// and after what a test does).
    async fn answered(&self, n: u64) {
        let from = self.ok.load(Ordering::Relaxed);
        until(&format!("{n} more answered lists"), WAIT, || {
            Ok((self.ok.load(Ordering::Relaxed) >= from + n).then_some(()))
        })
        .await;
    }

    /// Stops; the errors seen, the polls that found the APIService unavailable, the 200s.
    async fn finish(self) -> (Vec<String>, u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let (errors, unavailable) = self.task.await.unwrap();
        (errors, unavailable, self.ok.load(Ordering::Relaxed))
    }
}

fn the_chart_on_a_real_node_serves_a_tenant_from_its_pods() {
    node::run(|node| async move {
        let client = node.cluster.client().await.unwrap();
        // Fresh pods of both Deployments (other tests restart some on purpose), rolled out
        // through the kubelet's probes, from the imported image, with no restart.
        let mut values = node::values();
        values["podAnnotations"] = json!({"fresh": random_suffix()});
        let t0 = Instant::now();
        node.helm_upgrade(&values, &[]).unwrap();
        node.wait_rollout(CONTROLLER, Duration::from_secs(120))
            .unwrap();
        node.wait_rollout(DRIVER, Duration::from_secs(120)).unwrap();
        node::figure(&format!(
            "helm upgrade → fresh pods of both Deployments Available: {:.2}s",
            t0.elapsed().as_secs_f64()
        ));
        until("only the new pods are left", WAIT, || {
            let all = node.json(&["get", "pods", "-n", NAMESPACE])?;
            Ok((all["items"].as_array().map(Vec::len) == Some(3)).then_some(()))
        })
        .await;
        for (component, want) in [("controller", 2), ("range-driver", 1)] {
            let pods = node.pods(component).unwrap();
            assert_eq!(pods.len(), want, "{component} pods");
            for p in &pods {
                let ready = p["status"]["conditions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                assert!(ready, "{} not Ready: {}", pod_name(p), p["status"]);
                assert_eq!(p["spec"]["containers"][0]["image"], node.image.as_str());
                assert_eq!(restarts(p), 0, "{}", pod_name(p));
                assert_eq!(p["spec"]["nodeName"], "address-controller-node");
            }
        }
        // The APIService reaches the pods through a real Service and its EndpointSlice.
        let svc = node
            .json(&["get", "service", "address-controller-api", "-n", NAMESPACE])
            .unwrap();
        assert_eq!(svc["spec"]["type"], "ClusterIP");
        let slices = node
            .json(&[
                "get",
                "endpointslices",
                "-n",
                NAMESPACE,
                "-l",
                "kubernetes.io/service-name=address-controller-api",
            ])
            .unwrap();
        let endpoints: BTreeSet<String> = slices["items"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
            .filter(|e| e["conditions"]["ready"] == true)
            .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        let pod_ips: BTreeSet<String> = node
            .pods("controller")
            .unwrap()
            .iter()
            .map(pod_ip)
            .collect();
        assert_eq!(
            endpoints, pod_ips,
            "the Service's ready endpoints are the pods"
        );
        let views = node
            .cluster
            .kubectl_ok(&["get", "namespaceaddresses", "-A"])
            .unwrap();
        println!("kubectl get namespaceaddresses -A:\n{views}");

        // A tenant's journey: a claim binds, a Service naming it shows its address.
        let tenant = Tenant::new(&client, "node-tenant", "198.51.100.0/28").await;
        let t0 = Instant::now();
        let ip = tenant.bound_claim("web", WAIT).await;
        node::figure(&format!(
            "claim Bound by the pods: {:.2}s",
            t0.elapsed().as_secs_f64()
        ));
        let services: Api<Service> = Api::namespaced(client.clone(), &tenant.ns.name);
        services
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": "web",
                        "annotations": {"local.sdn.cozystack.io/ip-address-claim": "web"}},
                    "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}
                }))
                .unwrap(),
            )
            .await
            .unwrap();
        let shown = until("the Service shows the claim's address", WAIT, || {
            let s = node.json(&["get", "service", "web", "-n", &tenant.ns.name])?;
            Ok(s["status"]["loadBalancer"]["ingress"][0]["ip"]
                .as_str()
                .map(str::to_string))
        })
        .await;
        assert_eq!(shown, ip);
        node::figure(&format!(
            "Service web EXTERNAL-IP {shown} (claim web's address)"
        ));
        let view = node
            .json(&[
                "get",
                "namespaceaddresses",
                &tenant.ns.name,
                "-n",
                &tenant.ns.name,
            ])
            .unwrap();
        println!("namespaceaddresses/{}: {}", tenant.ns.name, view["summary"]);
        assert_eq!(view["summary"]["claims"]["bound"], 1, "{view}");
        assert_eq!(view["summary"]["associated"], 1, "{view}");
        tenant.check(node).await;
    });
}

fn the_pods_run_with_the_charts_security_context() {
    node::run(|node| async move {
        for (component, binary) in [
            ("controller", "/usr/local/bin/address-controller"),
            ("range-driver", "/usr/local/bin/range-driver"),
        ] {
            for p in node.pods(component).unwrap() {
                let name = pod_name(&p);
                let pid = container_pid(&p).unwrap();
                let status = proc_status(pid);
                // The chart's user, no privileges at all, seccomp filtering (RuntimeDefault).
                assert_eq!(status["Uid"], "65532\t65532\t65532\t65532", "{name}");
                assert_eq!(status["Gid"], "65532\t65532\t65532\t65532", "{name}");
                assert_eq!(status["NoNewPrivs"], "1", "{name}");
                assert_eq!(status["Seccomp"], "2", "{name}: seccomp filter mode");
                for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
                    assert_eq!(status[cap], "0000000000000000", "{name}: {cap}");
                }
                // The chart's command line, as containerd combined it with the image.
                let cmdline = proc_strings(pid, "cmdline");
                let c = &p["spec"]["containers"][0];
                let want = container_argv(c, binary);
                assert_eq!(cmdline, want, "{name}");
                // A read-only root: not even root on the host can write there.
                let err = std::fs::write(format!("/proc/{pid}/root/written"), "x").unwrap_err();
                assert_eq!(err.raw_os_error(), Some(30), "{name}: EROFS, got {err}");
                // The memory limit the kubelet set is the chart's.
                let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
                let mem = cgroup
                    .lines()
                    .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()))
                    .unwrap();
                let limit: u64 = std::fs::read_to_string(format!(
                    "/sys/fs/cgroup/memory{mem}/memory.limit_in_bytes"
                ))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
                let want_mi: u64 = c["resources"]["limits"]["memory"]
                    .as_str()
                    .unwrap()
                    .trim_end_matches("Mi")
                    .parse()
                    .unwrap();
                assert_eq!(limit, want_mi << 20, "{name}: memory limit");
                println!(
                    "{name}: pid {pid}, uid 65532, no capabilities, no_new_privs, seccomp filter, read-only root, memory limit {want_mi}Mi"
                );
            }
        }
        check_everything(node).await;
    });
}

/// The controller replica holding the lease, once there is one.
async fn leader(node: &Node) -> String {
    until("a leader", WAIT, || {
        let h = node.lease_holder(LEASE)?;
        Ok((!h.is_empty()).then_some(h))
    })
    .await
}

/// The leader's lease, watched: every holder it has, in order.
async fn lease_history(
    client: &Client,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<(Instant, String)>> {
    let api: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let wp = WatchParams::default().fields(&format!("metadata.name={LEASE}"));
    let mut stream = api.watch(&wp, "0").await.unwrap().boxed();
    // Returns once the watch has delivered the lease as it is now (its first event).
    let (first, first_seen) = tokio::sync::oneshot::channel::<()>();
    let mut first = Some(first);
    let task = tokio::spawn(async move {
        let mut seen: Vec<(Instant, String)> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let Ok(Some(ev)) = tokio::time::timeout(Duration::from_millis(200), stream.next())
                .await
                .map(|e| e.transpose().ok().flatten())
            else {
                continue;
            };
            if let WatchEvent::Added(l) | WatchEvent::Modified(l) = ev {
                let h = l.spec.and_then(|s| s.holder_identity).unwrap_or_default();
                if seen.last().map(|(_, x)| x) != Some(&h) {
                    seen.push((Instant::now(), h));
                }
                if let Some(tx) = first.take() {
                    let _ = tx.send(());
                }
            }
        }
        seen
    });
    tokio::time::timeout(Duration::from_secs(30), first_seen)
        .await
        .expect("the lease watch delivered nothing in 30s")
        .unwrap();
    task
}

fn deleting_the_leader_pod_hands_over_at_once_and_a_crash_within_the_lease() {
    node::run(|node| async move {
        let client = node.cluster.client().await.unwrap();
        let tenant = Tenant::new(&client, "node-takeover", "198.51.100.16/28").await;
        node.wait_rollout(CONTROLLER, WAIT).unwrap();
        let leader = leader(node).await;
        let pods: Vec<String> = node
            .pods("controller")
            .unwrap()
            .iter()
            .map(pod_name)
            .collect();
        assert!(pods.contains(&leader), "{leader} leads, pods {pods:?}");

        // Graceful: `kubectl delete pod` → SIGTERM → the lease is released → the other
        // replica takes it at its next retry.
        let stop = Arc::new(AtomicBool::new(false));
        let history = lease_history(&client, stop.clone()).await;
        let t0 = Instant::now();
        node.cluster
            .kubectl_ok(&["delete", "pod", &leader, "-n", NAMESPACE, "--wait=false"])
            .unwrap();
        let next = until("another replica leads", Duration::from_secs(40), || {
            let h = node.lease_holder(LEASE)?;
            Ok((!h.is_empty() && h != leader).then_some(h))
        })
        .await;
        let graceful = t0.elapsed();
        let ip = tenant.bound_claim("after-delete", WAIT).await;
        let bound = t0.elapsed();
        stop.store(true, Ordering::Relaxed);
        let seen = history.await.unwrap();
        let holders: Vec<&str> = seen.iter().map(|(_, h)| h.as_str()).collect();
        node::figure(&format!(
            "graceful takeover (kubectl delete pod of the leader → {next} leads): {:.2}s; next claim Bound ({ip}) {:.2}s; lease holders {holders:?}",
            graceful.as_secs_f64(),
            bound.as_secs_f64()
        ));
        // The deleted pod released the lease (an empty holder between the two), and the
        // other took it well inside the lease duration (15s): not by expiry.
        let released = holders.iter().position(|h| h.is_empty());
        let taken = holders.iter().position(|h| *h == next);
        assert!(
            matches!((released, taken), (Some(r), Some(t)) if r < t),
            "the lease was not released before {next} took it: {holders:?}"
        );
        assert!(graceful < Duration::from_secs(10), "{graceful:?}");

        // Ungraceful: SIGKILL of the new leader's process (a crash: no release). The
        // kubelet restarts the container; the lease is taken again only once it expired
        // or by the same pod (same identity) when it comes back.
        node.wait_rollout(CONTROLLER, WAIT).unwrap();
        let pod = node.pod(&next).unwrap();
        let before = restarts(&pod);
        let pid = container_pid(&pod).unwrap();
        let t1 = Instant::now();
        node::signal(pid, "KILL");
        // The claim made right after the crash binds once a leader works again.
        let ip = tenant
            .bound_claim("after-crash", Duration::from_secs(60))
            .await;
        let crash_bound = t1.elapsed();
        let after = until("the crashed container restarted", WAIT, || {
            let p = node.pod(&next)?;
            Ok((restarts(&p) > before).then_some(p))
        })
        .await;
        let holder = node.lease_holder(LEASE).unwrap();
        node::figure(&format!(
            "ungraceful (SIGKILL of the leader's process) → next claim Bound ({ip}) {:.2}s; restarts of {next}: {before} → {}; leader now {holder}",
            crash_bound.as_secs_f64(),
            restarts(&after)
        ));
        node.wait_rollout(CONTROLLER, WAIT).unwrap();
        tenant.check(node).await;
    });
}

fn a_rolling_upgrade_keeps_the_views_answering() {
    node::run(|node| async move {
        node.wait_rollout(CONTROLLER, WAIT).unwrap();
        let before: BTreeSet<String> = node
            .pods("controller")
            .unwrap()
            .iter()
            .map(pod_name)
            .collect();
        let watcher = Watcher::start(node).await;
        watcher.answered(10).await;
        // A changed value that restarts every pod: a pod annotation.
        let mut values = node::values();
        values["podAnnotations"] = json!({"rollout": random_suffix()});
        let t0 = Instant::now();
        node.helm_upgrade(&values, &[]).unwrap();
        node.wait_rollout(CONTROLLER, Duration::from_secs(120))
            .unwrap();
        let rolled = t0.elapsed();
        // Old pods gone (terminated) while the watcher keeps asking.
        until("the old pods are gone", WAIT, || {
            let all = node.json(&["get", "pods", "-n", NAMESPACE])?;
            let names: BTreeSet<String> = all["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(pod_name)
                .collect();
            Ok(names.is_disjoint(&before).then_some(()))
        })
        .await;
        let settled = t0.elapsed();
        watcher.answered(10).await;
        let (errors, unavailable, ok) = watcher.finish().await;
        let after: BTreeSet<String> = node
            .pods("controller")
            .unwrap()
            .iter()
            .map(pod_name)
            .collect();
        assert!(
            after.is_disjoint(&before),
            "every pod replaced: {before:?} → {after:?}"
        );
        node::figure(&format!(
            "rolling upgrade: rolled out {:.2}s, old pods gone {:.2}s; {ok} lists answered, {} errors, APIService unavailable in {unavailable} polls",
            rolled.as_secs_f64(),
            settled.as_secs_f64(),
            errors.len()
        ));
        assert!(errors.is_empty(), "errors during the rollout: {errors:#?}");
        assert_eq!(unavailable, 0, "the APIService went unavailable");
        node.wait_rollout(DRIVER, WAIT).unwrap();
        check_everything(node).await;
    });
}

fn the_serving_certificate_rotated_in_place_is_served_without_a_restart() {
    node::run(|node| async move {
        node.wait_rollout(CONTROLLER, WAIT).unwrap();
        let secret = "address-controller-api-tls";
        let s = node
            .json(&["get", "secret", secret, "-n", NAMESPACE])
            .unwrap();
        let old_ca =
            address_controller_tests::env::b64decode(s["data"]["ca.crt"].as_str().unwrap());
        // A new CA and serving certificate, for the same names.
        let dir = tempdir();
        let d: &std::path::Path = &dir;
        let sh = |script: &str| {
            let out = Command::new("bash")
                .args(["-ec", script])
                .current_dir(d)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        sh("openssl ecparam -name prime256v1 -genkey -noout -out ca.key
            openssl req -x509 -new -key ca.key -subj /CN=rotated-ca -days 2 -out ca.crt \
              -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign
            openssl ecparam -name prime256v1 -genkey -noout -out tls.key
            openssl req -new -key tls.key -subj /CN=address-controller-api -out tls.csr
            printf 'subjectAltName=DNS:address-controller-api.address-controller-system.svc,DNS:address-controller-api.address-controller-system.svc.cluster.local\\nextendedKeyUsage=serverAuth\\n' > ext
            openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile ext -out tls.crt");
        let read = |f: &str| std::fs::read(d.join(f)).unwrap();
        let b64 = |v: &[u8]| {
            let out = Command::new("base64")
                .arg("-w0")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            use std::io::Write;
            let mut out = out;
            out.stdin.take().unwrap().write_all(v).unwrap();
            String::from_utf8(out.wait_with_output().unwrap().stdout).unwrap()
        };
        let new_fp = file_fingerprint(&d.join("tls.crt")).unwrap();
        let pods = node.pods("controller").unwrap();
        let restarts_before: Vec<i64> = pods.iter().map(restarts).collect();
        // As an operator rotates: first trust both CAs, then swap the certificate, then
        // drop the old CA.
        let mut both = old_ca.clone();
        both.extend(read("ca.crt"));
        let patch_ca_bundle = |ca: &[u8]| {
            node.cluster
                .kubectl_ok(&[
                    "patch",
                    "apiservice",
                    "v1alpha1.view.local.sdn.cozystack.io",
                    "--type=merge",
                    "-p",
                    &json!({"spec": {"caBundle": b64(ca)}}).to_string(),
                ])
                .unwrap();
        };
        patch_ca_bundle(&both);
        let watcher = Watcher::start(node).await;
        let t0 = Instant::now();
        node.cluster.kubectl_ok(&["patch", "secret", secret, "-n", NAMESPACE, "--type=merge", "-p",
            &json!({"data": {"tls.crt": b64(&read("tls.crt")), "tls.key": b64(&read("tls.key")),
                             "ca.crt": b64(&read("ca.crt"))}}).to_string()]).unwrap();
        for p in &pods {
            let addr = format!("{}:6443", pod_ip(p));
            until(
                &format!("{} serves the new certificate", pod_name(p)),
                Duration::from_secs(120),
                || {
                    Ok(
                        (served_fingerprint(&addr).ok().as_deref() == Some(new_fp.as_str()))
                            .then_some(()),
                    )
                },
            )
            .await;
        }
        let served = t0.elapsed();
        patch_ca_bundle(&read("ca.crt"));
        watcher.answered(10).await;
        let (errors, unavailable, ok) = watcher.finish().await;
        let restarts_after: Vec<i64> = node
            .pods("controller")
            .unwrap()
            .iter()
            .map(restarts)
            .collect();
        node::figure(&format!(
            "Secret rotated in place → every replica serves the new certificate after {:.2}s (the kubelet's volume sync + the binary's reload); restarts {restarts_before:?} → {restarts_after:?}; {ok} lists answered, {} errors, APIService unavailable in {unavailable} polls",
            served.as_secs_f64(),
            errors.len()
        ));
        assert_eq!(restarts_before, restarts_after, "no restart");
        assert!(errors.is_empty(), "{errors:#?}");
        assert_eq!(unavailable, 0);
        node.cluster
            .kubectl_ok(&["get", "namespaceaddresses", "-A"])
            .unwrap();
    });
}

fn the_liveness_probe_restarts_a_hung_replica() {
    node::run(|node| async move {
        let client = node.cluster.client().await.unwrap();
        let tenant = Tenant::new(&client, "node-hang", "198.51.100.32/28").await;
        node.wait_rollout(CONTROLLER, WAIT).unwrap();
        let leader = leader(node).await;
        let pod = node.pod(&leader).unwrap();
        let before = restarts(&pod);
        let pid = container_pid(&pod).unwrap();
        // A hang: every thread of the leader stopped (SIGSTOP) — it answers nothing, renews
        // nothing, and cannot even handle SIGTERM.
        let t0 = Instant::now();
        node::signal(pid, "STOP");
        let next = until("the other replica leads", Duration::from_secs(60), || {
            let h = node.lease_holder(LEASE)?;
            Ok((!h.is_empty() && h != leader).then_some(h))
        })
        .await;
        let taken = t0.elapsed();
        let ip = tenant.bound_claim("while-hung", WAIT).await;
        let after = until(
            "the kubelet restarted the hung container",
            Duration::from_secs(150),
            || {
                let p = node.pod(&leader)?;
                Ok((restarts(&p) > before).then_some(p))
            },
        )
        .await;
        let restarted = t0.elapsed();
        let events = node
            .json(&[
                "get",
                "events",
                "-n",
                NAMESPACE,
                "--field-selector",
                &format!("involvedObject.name={leader},reason=Unhealthy"),
            ])
            .unwrap();
        let liveness: Vec<String> = events["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["message"].as_str())
            .filter(|m| m.starts_with("Liveness probe failed"))
            .map(str::to_string)
            .collect();
        node::figure(&format!(
            "hung leader (SIGSTOP) → {next} leads after {:.2}s (lease expiry), claim Bound meanwhile ({ip}); the kubelet restarted it after {:.2}s (restarts {before} → {}); liveness events: {liveness:?}",
            taken.as_secs_f64(),
            restarted.as_secs_f64(),
            restarts(&after)
        ));
        assert!(
            !liveness.is_empty(),
            "the restart came from the liveness probe"
        );
        node.wait_rollout(CONTROLLER, Duration::from_secs(120))
            .unwrap();
        tenant.check(node).await;
    });
}

fn a_node_drain_is_held_back_by_the_disruption_budget_and_the_views_keep_answering() {
    node::run(|node| async move {
        node.wait_rollout(CONTROLLER, WAIT).unwrap();
        let watcher = Watcher::start(node).await;
        watcher.answered(10).await;
        // The node drained as for maintenance: the PodDisruptionBudget (maxUnavailable 1)
        // lets one replica go and holds the other, which has nowhere else to run.
        let t0 = Instant::now();
        let out = node
            .cluster
            .kubectl()
            .args([
                "drain",
                "address-controller-node",
                "--pod-selector=app.kubernetes.io/component=controller",
                "--timeout=20s",
            ])
            .output()
            .unwrap();
        let drained = t0.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let remaining = node.pods("controller").unwrap();
        let ready_left = remaining
            .iter()
            .filter(|p| {
                p["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
            })
            .count();
        node.cluster
            .kubectl_ok(&["uncordon", "address-controller-node"])
            .unwrap();
        node.wait_rollout(CONTROLLER, Duration::from_secs(120))
            .unwrap();
        let (errors, unavailable, ok) = watcher.finish().await;
        node::figure(&format!(
            "drain of the node: {} after {:.2}s, {ready_left} replica(s) Ready; {ok} lists answered, {} errors, APIService unavailable in {unavailable} polls",
            if out.status.success() {
                "went through"
            } else {
                "refused"
            },
            drained.as_secs_f64(),
            errors.len()
        ));
        assert!(!out.status.success(), "the drain went through: {stderr}");
        assert!(
            stderr.contains("disruption budget"),
            "refused for another reason: {stderr}"
        );
        assert_eq!(ready_left, 1, "one replica kept: {remaining:#?}");
        assert!(errors.is_empty(), "{errors:#?}");
        assert_eq!(unavailable, 0);
        check_everything(node).await;
    });
}

/// `helm test` of the release: the output and whether it passed. The hook's Pod stays
/// (Completed or Failed, so that its log can be read) until the next `helm test`; it is
/// deleted here, as other tests count the release's pods.
fn helm_test(node: &Node) -> (bool, String) {
    let out = address_controller_tests::chart::helm()
        .args([
            "test",
            node::RELEASE,
            "-n",
            NAMESPACE,
            "--logs",
            "--timeout",
            "120s",
        ])
        .output()
        .unwrap();
    node.cluster
        .kubectl_ok(&[
            "delete",
            "pod",
            "address-controller-test",
            "-n",
            NAMESPACE,
            "--ignore-not-found",
            "--wait",
        ])
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn helm_test_runs_check_in_a_pod_and_fails_when_a_check_fails() {
    node::run(|node| async move {
        let client = node.cluster.client().await.unwrap();
        // The chart's hook: `address-controller check` in a Pod on the node, as its own
        // read-only ServiceAccount — every row passes on a working installation.
        let (ok, out) = helm_test(node);
        assert!(ok, "helm test failed:\n{out}");
        for row in [
            "crd/ipaddressclaims.local.sdn.cozystack.io",
            "apiservice/v1alpha1.view.local.sdn.cozystack.io",
            "(controller)",
            "(driver)",
            "access/list namespaceaddresses.view.local.sdn.cozystack.io",
        ] {
            let line = out.lines().find(|l| l.starts_with(row) || l.contains(row));
            assert!(
                line.is_some_and(|l| l.contains(" ok ")),
                "{row} not ok:\n{out}"
            );
        }
        assert!(
            !out.contains("class/"),
            "classes are skipped by default:\n{out}"
        );

        // Control: with classes checked and a class nobody serves, the hook's Pod exits 1
        // and `helm test` fails, naming the class.
        let classes: Api<IPAddressClass> = Api::all(client.clone());
        let name = format!("unserved-{}", random_suffix());
        classes
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name},
                    "spec": {"provisioner": "nobody.drivers.test"}}))
                .unwrap(),
            )
            .await
            .unwrap();
        let mut values = node::values();
        values["helmTest"] = json!({"skip": []});
        node.helm_upgrade(&values, &[]).unwrap();
        let (ok, out) = helm_test(node);
        let _ = classes.delete(&name, &Default::default()).await;
        node.helm_upgrade(&node::values(), &[]).unwrap();
        assert!(!ok, "helm test passed with an unserved class:\n{out}");
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("class/{name}")) && l.contains("FAIL")),
            "{out}"
        );
        check_everything(node).await;
    });
}

/// Guard (held before: the chart was hardened from the start) — the chart's pods as a
/// hardened cluster admits them: the release namespace enforces the `restricted` Pod
/// Security Standard (`node::install` labels it), the ReplicaSets' pods were admitted and
/// run, with the chart's default priority class outside kube-system (the helm-test Pod is
/// admitted there too: `helm_test_runs_check_in_a_pod_and_fails_when_a_check_fails`). The
/// control: a pod that breaks `restricted` is refused in that namespace.
fn the_pods_are_admitted_under_the_restricted_pod_security_standard() {
    node::run(|node| async move {
        let ns = node.json(&["get", "namespace", NAMESPACE]).unwrap();
        assert_eq!(
            ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
            "restricted"
        );
        for component in ["controller", "range-driver"] {
            let pods = node.pods(component).unwrap();
            assert!(!pods.is_empty(), "no {component} pod");
            for p in &pods {
                assert_eq!(p["spec"]["priorityClassName"], "system-cluster-critical");
                assert!(
                    p["spec"]["priority"].as_i64().unwrap() >= 2_000_000_000,
                    "{}",
                    p["spec"]["priority"]
                );
                assert_eq!(p["status"]["phase"], "Running", "{}", pod_name(p));
            }
        }
        let bad = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "escalates", "namespace": NAMESPACE},
            "spec": {"containers": [{"name": "c", "image": node.image,
                "securityContext": {"allowPrivilegeEscalation": true}}]}});
        let dir = tempdir();
        let file = dir.join("pod.json");
        std::fs::write(&file, bad.to_string()).unwrap();
        let out = node
            .cluster
            .kubectl()
            .args(["create", "--dry-run=server", "-f"])
            .arg(&file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("violates PodSecurity"),
            "{err}"
        );
        check_everything(node).await;
    });
}

address_controller_tests::node_main![
    the_chart_on_a_real_node_serves_a_tenant_from_its_pods,
    the_pods_run_with_the_charts_security_context,
    deleting_the_leader_pod_hands_over_at_once_and_a_crash_within_the_lease,
    a_rolling_upgrade_keeps_the_views_answering,
    the_serving_certificate_rotated_in_place_is_served_without_a_restart,
    the_liveness_probe_restarts_a_hung_replica,
    a_node_drain_is_held_back_by_the_disruption_budget_and_the_views_keep_answering,
    helm_test_runs_check_in_a_pod_and_fails_when_a_check_fails,
    the_pods_are_admitted_under_the_restricted_pod_security_standard,
];
