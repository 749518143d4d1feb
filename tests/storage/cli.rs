//! The binary against the S3 server, configured only through the standard
//! environment variables (`AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, keys, region).

use crate::server::{ACCESS_KEY, S3Server, SECRET_KEY};
use assert_cmd::Command;

fn tfpipe(server: &S3Server) -> Command {
    let mut cmd = Command::cargo_bin("tfpipe").unwrap();
    cmd.env("AWS_ENDPOINT_URL", server.endpoint())
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", "us-east-1")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_SESSION_TOKEN");
    cmd
}

#[test]
fn convert_to_s3_then_cat_inspect_and_bench_the_url_glob() {
    let server = S3Server::start();
    let bucket = server.bucket("cli");
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("in.csv");
    let mut text = String::from("x,y\n");
    for i in 0..40 {
        text.push_str(&format!("{i},{}\n", i * 3));
    }
    std::fs::write(&csv, text).unwrap();
    let out = tfpipe(&server)
        .args(["convert", "csv"])
        .arg(&csv)
        .arg("--output")
        .arg(format!("{bucket}/d/data"))
        .args(["--shards", "2", "--json"])
        .assert()
        .success();
    let report: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(report["records"], 40, "{report}");
    assert!(server.exists(&format!("{bucket}/d/data-00001-of-00002.tfrecord")));
    assert!(server.exists(&format!("{bucket}/d/data.features.json")));

    let glob = format!("{bucket}/d/data-*.tfrecord");
    let out = tfpipe(&server).arg("cat").arg(&glob).assert().success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(
        stdout.contains("117"),
        "the last row's y is printed: {stdout}"
    );
    tfpipe(&server)
        .arg("inspect")
        .arg(format!("{bucket}/d/data-00000-of-00002.tfrecord"))
        .assert()
        .success();
    tfpipe(&server)
        .args(["bench", "--data", &glob])
        .args(["--feature", "x:int64", "--feature", "y:int64"])
        .args(["--batch-size", "8", "--shuffle-buffer", "16"])
        .assert()
        .success();
    // A missing object: exit 2, the URL named.
    let missing = format!("{bucket}/d/nope.tfrecord");
    let out = tfpipe(&server).arg("cat").arg(&missing).assert().code(2);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(stderr.contains(&missing), "{stderr}");
}

#[test]
fn a_refused_request_prints_its_cause_once() {
    // Without AWS_ALLOW_HTTP the client refuses the plain-HTTP endpoint
    // before any request is sent; the reason sits deep in the source chain
    // (under object_store's and reqwest's "builder error") and must be
    // printed, exactly once.
    let server = S3Server::start();
    let bucket = server.bucket("nohttp");
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("in.csv");
    std::fs::write(&csv, "x\n1\n").unwrap();
    let out = tfpipe(&server)
        .env_remove("AWS_ALLOW_HTTP")
        .args(["convert", "csv"])
        .arg(&csv)
        .arg("--output")
        .arg(format!("{bucket}/d/data"))
        .assert()
        .code(2);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(stderr.contains(&format!("{bucket}/d/data")), "{stderr}");
    assert_eq!(
        stderr.matches("URL scheme is not allowed").count(),
        1,
        "{stderr}"
    );
    assert_eq!(stderr.matches("builder error").count(), 1, "{stderr}");
}
