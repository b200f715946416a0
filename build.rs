// Records the git revision for the `latchkey_build_info` metric, and
// rebuilds when a migration is added.
fn main() {
    let rev = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=LATCHKEY_GIT_REVISION={rev}");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    // sqlx::migrate! embeds the migrations: a new file must rebuild the crate.
    println!("cargo:rerun-if-changed=migrations");
}
