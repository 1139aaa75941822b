//! The TLS door as two scanners see it, in `cargo test`: testssl.sh (Debian) checks the
//! protocols offered and the known vulnerabilities, sslyze (PyPI) its own list. Each must
//! find only TLS 1.2 and 1.3, and nothing vulnerable. `loadtest/tls-scan.sh` keeps their
//! whole reports in docs/results/tls-scan/.
//!
//! Skips without them, except under CI (`.ci/run` installs both).

mod common;

use std::process::Command;
use std::time::Duration;

use common::tls::server_with;
use common::{find_on_path, short_config, skip_without};
use idlegate::Config;

const INSTALL: &str = "apt-get install testssl.sh && python3 -m pip install sslyze";

fn sslyze() -> bool {
    Command::new("python3").args(["-c", "import sslyze"]).output().is_ok_and(|o| o.status.success())
}

#[test]
fn testssl_and_sslyze_find_tls_1_2_and_1_3_only_and_nothing_vulnerable() {
    let Some(testssl) = find_on_path(&["testssl", "testssl.sh"]) else {
        return skip_without("testssl.sh", INSTALL);
    };
    if !sslyze() {
        return skip_without("sslyze", INSTALL);
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = Config { timeout: Duration::from_secs(60), login_timeout: Duration::from_secs(10), ..short_config() };
    let (mut server, ca, _dir) = rt.block_on(server_with(config));
    let (Some(_ca), Some(door)) = (ca, server.tls) else { return };
    let target = door.to_string();

    // Protocols (-p) and vulnerabilities (-U).
    let out = Command::new(&testssl)
        .args(["--quiet", "--color", "0", "--warnings", "off", "--openssl-timeout", "10", "-p", "-U", &target])
        .output()
        .expect("testssl.sh runs");
    let report = String::from_utf8_lossy(&out.stdout);
    let line = |label: &str| report.lines().find(|l| l.trim_start().starts_with(label)).unwrap_or("").to_string();
    for old in ["SSLv2", "SSLv3", "TLS 1 ", "TLS 1.1"] {
        assert!(line(old).contains("not offered"), "{old}: {report}");
    }
    for offered in ["TLS 1.2", "TLS 1.3"] {
        assert!(line(offered).contains("offered (OK)"), "{offered}: {report}");
    }
    for check in
        ["Heartbleed", "CCS", "ROBOT", "CRIME", "POODLE", "SWEET32", "FREAK", "DROWN", "LOGJAM", "BEAST", "LUCKY13"]
    {
        assert!(!line(check).is_empty(), "testssl.sh ran no {check} check: {report}");
    }
    assert!(!report.contains("VULNERABLE"), "{report}");

    let out = Command::new("python3").args(["-m", "sslyze", &target]).output().expect("sslyze runs");
    let report = String::from_utf8_lossy(&out.stdout);
    for finding in [
        "Not vulnerable to Heartbleed",
        "Not vulnerable to OpenSSL CCS injection",
        "Not vulnerable, RSA cipher suites not supported",
        "Compression disabled",
        "TLS_FALLBACK_SCSV:                 OK - Supported",
    ] {
        assert!(report.contains(finding), "sslyze: no {finding:?}: {report}");
    }
    // sslyze writes a finding against the server as "VULNERABLE".
    assert!(!report.contains("VULNERABLE"), "{report}");
    rt.block_on(server.shutdown());
}
