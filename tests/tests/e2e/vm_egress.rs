//! `sandbox start WS --vm --net egress`: a VM sandbox reaches what its policy allows and
//! nothing else, as a namespace sandbox does (`egress.rs`). The guest has no network
//! device at all (only `lo`); its agent listens on the guest's 127.0.0.1 for HTTP, SOCKS
//! and DNS and relays each connection over the VM's channel to the host-side proxy,
//! which decides. The origin is the test's own server on the host's 127.0.0.1, named
//! inside by `--add-host`. The guest has busybox: requests are written with `nc` to the
//! proxy's port the exec's `http_proxy` names (busybox's `wget` crashes in this guest,
//! with or without a network), names looked up with `nslookup`. A one-shot
//! `run --vm --net egress` gets the same.
//!
//! Skips like the other VM tests when not root or without qemu, virtiofsd or the guest
//! kernel; fails instead under `CI=true`.

use cowspace_tests::write_file;
use serde_json::Value;

use crate::egress::Origin;
use crate::vm::{require_vm, setup};
use crate::vm_sandbox::{assert_vm_gone, exec, start_vm};
use crate::workspaces::support::alive;

#[test]
fn vm_sandbox_egress_allows_by_policy_and_nothing_else() {
    const WS: &str = "vmegress";
    require_vm!();
    let r = setup(WS);
    let www = r.t.path("www");
    write_file(&www.join("f"), "from the origin\n");
    let o = Origin::serve(&www);
    let port = o.port.to_string();
    let url = |host: &str| format!("http://{host}:{port}/f");
    let v = start_vm(
        &r,
        WS,
        &[
            "--net",
            "egress",
            "--add-host",
            "origin.test:127.0.0.1",
            "--add-host",
            "denied.test:127.0.0.1",
            "--allow-host",
            "origin.test",
        ],
    );
    let st: Value = r.t.json(["sandbox", "status", WS]).ok().json();
    assert_eq!(st["net"], "egress", "{st}");
    assert_eq!(st["egress"]["state"], "running", "{st}");
    let proxy = st["egress"]["proxy_pid"].as_u64().expect("proxy_pid") as u32;
    assert!(alive(proxy), "{st}");
    let sh = |script: &str| exec(&r, WS, &["sh", "-c", script]);
    // An HTTP request through the proxy `http_proxy` names: the raw answer.
    let get = |host: &str| {
        let u = url(host);
        let script = format!(
            "proxy=${{http_proxy#http://}}; printf 'GET {u} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\nConnection: close\\r\\n\\r\\n' \\
             | nc -w 30 ${{proxy%:*}} ${{proxy##*:}}"
        );
        sh(&script)
    };

    // Allowed, through the proxy variables the exec's environment carries.
    let got = get("origin.test").ok().stdout;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(got.ends_with("\r\n\r\nfrom the origin\n"), "{got}");
    // The guest's resolver is the proxy's: an allowed name resolves, another is refused.
    let ns = sh("nslookup origin.test").ok();
    assert!(ns.stdout.contains("127.0.0.1"), "{}", ns.stdout);
    let ns = sh("nslookup denied.test");
    assert_ne!(ns.code, 0, "a denied name resolved: {}", ns.stdout);
    // A host the policy does not allow: the proxy answers 403.
    let d = get("denied.test").ok().stdout;
    assert!(d.starts_with("HTTP/1.1 403"), "{d}");
    assert!(!d.contains("from the origin"), "{d}");
    // Without the proxy there is no way out: the guest's 127.0.0.1 is its own, and no
    // other address has a route.
    for target in ["127.0.0.1", "10.0.2.2", "192.168.1.1", "169.254.169.254"] {
        let b = sh(&format!(
            "printf 'GET /f HTTP/1.0\\r\\n\\r\\n' | nc -w 10 {target} {port}"
        ));
        assert_ne!(
            b.code, 0,
            "{target} reached without the proxy: {}",
            b.stdout
        );
        assert!(!b.stdout.contains("from the origin"), "{target}");
    }
    let ip = sh("ip -o link 2>/dev/null || cat /proc/net/dev")
        .ok()
        .stdout;
    assert!(!ip.contains("eth0"), "the guest has a network device: {ip}");

    // A live change: denied from the next connection on, then allowed again.
    r.t.json(["sandbox", "policy", WS, "--deny-host", "origin.test"])
        .ok();
    let d = get("origin.test").ok().stdout;
    assert!(d.starts_with("HTTP/1.1 403"), "{d}");
    r.t.json([
        "sandbox",
        "policy",
        WS,
        "--remove-host",
        "origin.test",
        "--allow-host",
        "origin.test",
    ])
    .ok();
    let got = get("origin.test").ok().stdout;
    assert!(got.ends_with("from the origin\n"), "{got}");

    // The decision log has each verdict, in order.
    let log = r.t.json(["sandbox", "log", WS]).ok().stdout;
    let verdicts: Vec<(String, String)> = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|d| d["via"] == "http")
        .map(|d| {
            (
                d["host"].as_str().unwrap().to_string(),
                d["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("origin.test", "allowed"),
        ("denied.test", "denied"),
        ("origin.test", "denied"),
        ("origin.test", "allowed"),
    ]
    .iter()
    .map(|(h, v)| (h.to_string(), v.to_string()))
    .collect();
    assert_eq!(verdicts, want, "{log}");

    let s: Value = r.t.json(["sandbox", "stop", WS]).ok().json();
    assert_eq!(s["stopped"], true, "{s}");
    assert_vm_gone(&r, WS, &v);
    assert!(
        !alive(proxy),
        "the egress proxy {proxy} outlived its sandbox"
    );

    // A one-shot run has the same way out, and only it.
    let req = |host: &str| {
        format!(
            "printf 'GET {} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\nConnection: close\\r\\n\\r\\n' | nc -w 30 127.0.0.1 3128",
            url(host)
        )
    };
    let script = format!("{}; echo; {}", req("origin.test"), req("denied.test"));
    let run = r.t.run([
        "run",
        WS,
        "--vm",
        "--accept-emulation",
        "--net",
        "egress",
        "--add-host",
        "origin.test:127.0.0.1",
        "--add-host",
        "denied.test:127.0.0.1",
        "--allow-host",
        "origin.test",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.starts_with("HTTP/1.1 200"), "{}", run.stdout);
    assert!(
        run.stdout.contains("from the origin\n\nHTTP/1.1 403"),
        "{}",
        run.stdout
    );
    drop(o);
}
