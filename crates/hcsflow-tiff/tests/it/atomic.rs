//! Atomic writes: a failed write never leaves a partial file at the target
//! path, keeps the previous file intact, and cleans up its temporary.

use crate::common;

use std::ffi::OsString;
use std::path::Path;

use common::{random_stack, smooth_u16};
use hcsflow_core::DType;
use hcsflow_tiff::{read_stack, write_stack, TiffError, WriteOptions};

fn listing(dir: &Path) -> Vec<OsString> {
    let mut names: Vec<_> = std::fs::read_dir(dir).expect("ls").map(|e| e.expect("entry").file_name()).collect();
    names.sort();
    names
}

#[test]
fn writing_into_a_missing_directory_names_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("no-such-dir").join("plate.tif");
    let err = write_stack(&target, &random_stack(DType::U16, [1, 4, 4], 0), &WriteOptions::default()).expect_err("missing directory");
    assert!(matches!(&err, TiffError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound), "{err:?}");
    assert_eq!(err.path(), target);
    assert!(err.to_string().contains("no-such-dir/plate.tif"), "{err}");
    assert!(listing(dir.path()).is_empty(), "the directory is not created");
}

#[test]
fn writing_below_a_regular_file_fails_and_leaves_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, b"plain file").expect("write");
    let target = blocker.join("x.tif");
    let err = write_stack(&target, &random_stack(DType::U8, [2, 3, 3], 0), &WriteOptions::default()).expect_err("parent is a file");
    assert!(matches!(err, TiffError::Io { .. }), "{err:?}");
    assert_eq!(err.path(), target);
    assert_eq!(listing(dir.path()), vec![OsString::from("not-a-dir")]);
    assert_eq!(std::fs::read(&blocker).expect("read"), b"plain file");
}

#[test]
fn a_failed_rename_keeps_the_target_and_removes_the_temporary() {
    // The target is a non-empty directory: everything is written, then the
    // final rename fails.
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("busy.tif");
    std::fs::create_dir(&target).expect("mkdir");
    std::fs::write(target.join("keep"), b"keep").expect("write");
    let err = write_stack(&target, &random_stack(DType::F32, [2, 8, 8], 0), &WriteOptions::default()).expect_err("rename onto a directory");
    assert!(matches!(err, TiffError::Io { .. }), "{err:?}");
    assert_eq!(listing(dir.path()), vec![OsString::from("busy.tif")], "temporary removed");
    assert_eq!(std::fs::read(target.join("keep")).expect("read"), b"keep");
}

#[test]
fn a_successful_write_leaves_only_the_target() {
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..3 {
        let target = dir.path().join(format!("w{i}.tif"));
        write_stack(&target, &random_stack(DType::U16, [2, 5, 5], i), &WriteOptions::default()).expect("write");
    }
    assert_eq!(listing(dir.path()), vec![OsString::from("w0.tif"), OsString::from("w1.tif"), OsString::from("w2.tif")]);
}

#[test]
fn a_relative_path_without_directory_is_written_in_the_working_directory() {
    // `Path::parent` of "x.tif" is "", which must mean ".", not fail.
    let dir = tempfile::tempdir().expect("tempdir");
    let stack = random_stack(DType::U8, [1, 2, 3], 9);
    let status = std::process::Command::new(std::env::current_exe().expect("exe"))
        .args(["--exact", "atomic::child_writes_relative_path", "--ignored", "--test-threads=1"])
        .current_dir(dir.path())
        .env("HCSFLOW_TIFF_CHILD", "relative")
        .output()
        .expect("spawn");
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stdout));
    assert_eq!(read_stack(&dir.path().join("relative.tif")).expect("read"), stack);
    assert_eq!(listing(dir.path()), vec![OsString::from("relative.tif")]);
}

/// Child half of the test above (runs with the working directory set).
#[test]
#[ignore = "run as a child process by a_relative_path_without_directory_is_written_in_the_working_directory"]
fn child_writes_relative_path() {
    if std::env::var("HCSFLOW_TIFF_CHILD").as_deref() != Ok("relative") {
        return;
    }
    let stack = random_stack(DType::U8, [1, 2, 3], 9);
    write_stack(Path::new("relative.tif"), &stack, &WriteOptions::default()).expect("write");
}

/// A write interrupted half-way by the operating system: the child process
/// runs with a file-size limit (`ulimit -f`) far below the stack's size, so
/// its `write` calls fail with EFBIG in the middle of the pixel data.
#[cfg(unix)]
#[test]
fn an_interrupted_write_keeps_the_previous_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("plate.tif");
    let previous = random_stack(DType::U8, [1, 8, 8], 1);
    write_stack(&target, &previous, &WriteOptions::default()).expect("previous file");
    let before = std::fs::read(&target).expect("read");

    let exe = std::env::current_exe().expect("exe");
    // `trap '' XFSZ`: an ignored signal stays ignored across exec, so the
    // over-limit write fails with EFBIG instead of killing the child.
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 64 && exec \"$0\" \"$@\"")
        .arg(&exe)
        .args(["--exact", "atomic::child_write_hits_file_size_limit", "--ignored", "--nocapture", "--test-threads=1"])
        .env("HCSFLOW_TIFF_CHILD", &target)
        .output()
        .expect("spawn");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("CHILD: write failed as expected"), "child did not run:\n{stdout}\n{stderr}");

    assert_eq!(std::fs::read(&target).expect("read"), before, "previous file unchanged");
    assert_eq!(read_stack(&target).expect("read"), previous);
    assert_eq!(listing(dir.path()), vec![OsString::from("plate.tif")], "no temporary left behind");
}

/// Child half of the test above.
#[cfg(unix)]
#[test]
#[ignore = "run as a child process by an_interrupted_write_keeps_the_previous_file"]
fn child_write_hits_file_size_limit() {
    let Some(target) = std::env::var_os("HCSFLOW_TIFF_CHILD") else {
        return;
    };
    let target = std::path::PathBuf::from(target);
    // 4 MB of pixels against a 32-64 KiB limit (the block size of `ulimit -f`
    // differs between shells).
    let big = smooth_u16([2, 1024, 1024]);
    let err = write_stack(&target, &big, &WriteOptions::default()).expect_err("must hit the limit");
    match &err {
        TiffError::Io { path, source } => {
            assert_eq!(path, &target);
            assert_eq!(source.raw_os_error(), Some(27), "EFBIG, got {source}");
        }
        other => panic!("expected an I/O error, got {other:?}"),
    }
    println!("CHILD: write failed as expected: {err}");
}
