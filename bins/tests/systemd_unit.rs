//! `contrib/websubd.service` as systemd reads it: `systemd-analyze verify`
//! on a copy whose `ExecStart` is the websubd just built (verify checks
//! the binary exists) reports nothing at all, and `systemd-analyze
//! security` rates the sandbox as well exposed as little.

use std::path::{Path, PathBuf};
use std::process::Command;

const UNIT: &str = include_str!("../../contrib/websubd.service");

/// The highest exposure `systemd-analyze security` may give the unit
/// (0 is fully locked down, 10 is unprotected; "OK" ends at 2.0).
const MOST_EXPOSURE: f64 = 2.0;

/// `systemd-analyze`, or `None` (with the reason printed) when it is
/// missing outside CI. In CI a missing one fails the test: a unit nobody
/// verified must not pass.
fn systemd_analyze() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("systemd-analyze"))
        .find(|candidate| candidate.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but systemd-analyze is not installed (Debian package `systemd`)"
        );
        eprintln!("skipped: systemd-analyze is not installed (Debian package `systemd`)");
    }
    found
}

/// The unit, with `ExecStart` the built websubd, in a fresh directory.
fn unit_with_built_binary() -> PathBuf {
    let dir = websub_storetest::scratch::path("systemd-unit");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let binary = env!("CARGO_BIN_EXE_websubd");
    let mut replaced = 0;
    let unit: String = UNIT
        .lines()
        .map(|line| {
            if line.starts_with("ExecStart=") {
                replaced += 1;
                format!("ExecStart={binary}\n")
            } else {
                format!("{line}\n")
            }
        })
        .collect();
    assert_eq!(replaced, 1, "the unit has one ExecStart");
    let path = dir.join("websubd.service");
    std::fs::write(&path, unit).expect("write the unit");
    path
}

fn run(analyze: &Path, args: &[&str], unit: &Path) -> (bool, String, String) {
    let output = Command::new(analyze)
        .args(args)
        .arg(unit)
        .env("SYSTEMD_LOG_COLOR", "0")
        .output()
        .expect("run systemd-analyze");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_unit_verifies_cleanly() {
    let Some(analyze) = systemd_analyze() else {
        return;
    };
    let unit = unit_with_built_binary();
    // verify exits 0 on an unknown or misspelt key and only says so, so a
    // clean result is no output at all.
    let (success, stdout, stderr) = run(&analyze, &["verify", "--man=no"], &unit);
    assert!(success, "systemd-analyze verify failed:\n{stdout}{stderr}");
    assert_eq!(
        format!("{stdout}{stderr}").trim(),
        "",
        "systemd-analyze verify is not clean"
    );
}

#[test]
fn a_misspelt_key_is_not_clean() {
    let Some(analyze) = systemd_analyze() else {
        return;
    };
    let unit = unit_with_built_binary();
    let text = std::fs::read_to_string(&unit).expect("read the unit");
    std::fs::write(
        &unit,
        text.replace("ProtectSystem=strict", "ProtectSystm=strict"),
    )
    .expect("write the unit");
    let (_, stdout, stderr) = run(&analyze, &["verify", "--man=no"], &unit);
    assert!(
        format!("{stdout}{stderr}").contains("ProtectSystm"),
        "verify did not report the misspelt key: {stdout}{stderr}"
    );
}

#[test]
fn the_sandbox_exposes_little() {
    let Some(analyze) = systemd_analyze() else {
        return;
    };
    let unit = unit_with_built_binary();
    let (_, stdout, stderr) = run(&analyze, &["security", "--offline=yes"], &unit);
    let exposure: f64 = stdout
        .lines()
        .find_map(|line| line.split_once("Overall exposure level for websubd.service:"))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|level| level.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in:\n{stdout}{stderr}"));
    assert!(
        exposure <= MOST_EXPOSURE,
        "exposure {exposure} is above {MOST_EXPOSURE}:\n{stdout}"
    );
}
