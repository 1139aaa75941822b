//! What `deploy/` ships: the systemd unit passes `systemd-analyze verify` with no warning
//! (its `ExecStart` pointed at the binary built here, since verify checks that it exists).
//! The unit is not run here: these machines have no systemd as their init.

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn the_systemd_unit_verifies_with_no_warning() {
    let Some(analyze) = common::find_on_path(&["systemd-analyze"]) else {
        return common::skip_without("systemd-analyze", "apt-get install systemd");
    };
    let unit = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/idlegate.service")).unwrap();
    for needed in [
        "DynamicUser=yes",
        "LimitNOFILE=",
        "ProtectSystem=strict",
        "CapabilityBoundingSet=\n",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "Restart=on-failure",
    ] {
        assert!(unit.contains(needed), "the unit lacks {needed:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    let here = dir.path().join("idlegate.service");
    std::fs::write(&here, unit.replace("/usr/local/bin/idlegate", env!("CARGO_BIN_EXE_idlegate"))).unwrap();
    let out = Command::new(analyze).arg("verify").arg(&here).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "systemd-analyze verify failed: {said}");
    assert_eq!(said.trim(), "", "systemd-analyze verify warned");
}
