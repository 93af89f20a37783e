//! The committed fixtures as plain files.
//!
//! `fixtures/` stores its large files zstd-compressed (`model.safetensors.zst`, `tokenizer.json.zst`, …;
//! see fixtures/README.md) to keep the tracked tree small. Tests need plain files, and a directory that
//! `Checkpoint::open` can read, so every reader goes through this crate: [`fixtures`] copies the whole
//! tree once per process into a cache under the cargo target dir (`<target>/<profile>/testdata/`),
//! decompressing each `X.zst` into `X` (symlinks followed, so `qwen3_realtok/tokenizer.json` is a real
//! file there), and returns the copy's root. A decompressed file is rewritten only when its source
//! changed (a stamp beside the copy records the compressed file's length and FNV-1a hash); every write
//! is a rename of a finished temporary file, so concurrent test processes never see a partial file.
//!
//! Nothing here skips: a missing source tree, a missing fixture or a corrupt frame panics (in
//! [`fixtures`] / [`fixture`]) or returns an error ([`materialize`]) naming the path.

pub mod gguf_tools;

use std::collections::HashSet;
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The suffix of a stored compressed file: `X.zst` materializes as `X`.
pub const COMPRESSED_SUFFIX: &str = ".zst";

/// The repository's `fixtures/` directory as committed (compressed files included), or
/// `$TURBOSPARK_FIXTURES` (a test executable run away from its checkout).
pub fn source_root() -> PathBuf {
    match std::env::var_os("TURBOSPARK_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"),
    }
}

/// A writable cache directory under the cargo target dir: `<target>/<profile>/testdata` for a test
/// executable in `<target>/<profile>/deps/` or a binary in `<target>/<profile>/`; the system temp dir
/// when the executable's path is unknown.
pub fn cache_dir() -> PathBuf {
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    match exe_dir {
        Some(dir) if dir.file_name().is_some_and(|n| n == "deps") => {
            dir.parent().unwrap_or(&dir).join("testdata")
        }
        Some(dir) => dir.join("testdata"),
        None => std::env::temp_dir().join("turbospark-testdata"),
    }
}

/// The materialized copy of the whole `fixtures/` tree (made on the first call in a process; later calls
/// return the same path). Panics, naming the paths, if the tree cannot be read or written.
pub fn fixtures() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let src = source_root();
        let dst = cache_dir().join("fixtures");
        if let Err(e) = materialize(&src, &dst) {
            panic!(
                "testdata: materializing {} into {}: {e}",
                src.display(),
                dst.display()
            );
        }
        dst
    })
}

/// A materialized fixture file or directory, by its path under `fixtures/` without `.zst`
/// (`"qwen3_5"`, `"qwen3_realtok/reference.safetensors"`, `"tokenizers/qwen3/tokenizer.json"`).
/// Panics if it does not exist.
pub fn fixture(rel: &str) -> PathBuf {
    let path = fixtures().join(rel);
    assert!(
        path.exists(),
        "testdata: fixture {rel:?} does not exist (looked for {} and {}{COMPRESSED_SUFFIX} under {})",
        rel,
        rel,
        source_root().display()
    );
    path
}

/// Copies the tree `src` into `dst` (created if needed): `X.zst` becomes `X` decompressed, other files
/// are copied as they are, symlinks are followed, and entries of `dst` with no source are removed.
/// Decompressed files are rewritten only when their compressed source changed (stamps are kept in a
/// sibling directory `<dst>.stamps`).
pub fn materialize(src: &Path, dst: &Path) -> io::Result<()> {
    let stamps = {
        let mut name = dst.file_name().unwrap_or_default().to_os_string();
        name.push(".stamps");
        dst.with_file_name(name)
    };
    copy_tree(src, dst, &stamps)
}

fn copy_tree(src: &Path, dst: &Path, stamps: &Path) -> io::Result<()> {
    fs::create_dir_all(dst).map_err(|e| at(dst, e))?;
    let mut keep = HashSet::new();
    let mut entries: Vec<_> = fs::read_dir(src)
        .map_err(|e| at(src, e))?
        .collect::<io::Result<_>>()
        .map_err(|e| at(src, e))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let name = entry.file_name().into_string().map_err(|_| {
            at(
                &path,
                io::Error::new(io::ErrorKind::InvalidData, "non-UTF-8 file name"),
            )
        })?;
        let meta = fs::metadata(&path).map_err(|e| at(&path, e))?; // follows symlinks
        let plain = match name.strip_suffix(COMPRESSED_SUFFIX) {
            Some(plain) if meta.is_file() => plain.to_string(),
            _ => name.clone(),
        };
        if !keep.insert(plain.clone()) {
            return Err(at(
                &path,
                io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("both {plain} and {plain}{COMPRESSED_SUFFIX} are stored"),
                ),
            ));
        }
        let target = dst.join(&plain);
        if meta.is_dir() {
            copy_tree(&path, &target, &stamps.join(&plain))?;
        } else if plain != name {
            let packed = fs::read(&path).map_err(|e| at(&path, e))?;
            let stamp_path = stamps.join(format!("{plain}.stamp"));
            let stamp = format!("{} {:016x}\n", packed.len(), fnv1a(&packed));
            let fresh = target.is_file()
                && fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str());
            if !fresh {
                let bytes = decompress(&packed).map_err(|e| at(&path, e))?;
                write_atomic(&target, &bytes)?;
                fs::create_dir_all(stamps).map_err(|e| at(stamps, e))?;
                write_atomic(&stamp_path, stamp.as_bytes())?;
            }
        } else {
            let bytes = fs::read(&path).map_err(|e| at(&path, e))?;
            if fs::read(&target).ok().as_deref() != Some(bytes.as_slice()) {
                write_atomic(&target, &bytes)?;
            }
        }
    }
    // Entries whose source is gone (a fixture renamed or removed since the last run).
    for entry in fs::read_dir(dst).map_err(|e| at(dst, e))? {
        let entry = entry.map_err(|e| at(dst, e))?;
        let name = entry.file_name();
        if name.to_str().is_some_and(|n| keep.contains(n)) || is_temporary(&name) {
            continue;
        }
        let path = entry.path();
        let removed = if path.is_dir() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        match removed {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(at(&path, e)),
            _ => {}
        }
    }
    Ok(())
}

/// Decodes every zstd frame of `packed` (one, as the generator writes), checking each frame's content
/// checksum when it has one.
pub fn decompress(packed: &[u8]) -> io::Result<Vec<u8>> {
    let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidData, msg);
    let mut src = packed;
    let mut out = Vec::new();
    if src.is_empty() {
        return Err(invalid("empty zstd file".into()));
    }
    while !src.is_empty() {
        let mut decoder = ruzstd::decoding::StreamingDecoder::new(&mut src)
            .map_err(|e| invalid(format!("zstd frame header: {e}")))?;
        decoder.read_to_end(&mut out)?;
        let frame = decoder.into_frame_decoder();
        if let Some(stored) = frame.get_checksum_from_data() {
            let computed = frame.get_calculated_checksum();
            if computed != Some(stored) {
                return Err(invalid(format!(
                    "zstd checksum mismatch: stored {stored:08x}, computed {computed:08x?}"
                )));
            }
        }
    }
    Ok(out)
}

const TEMP_MARK: &str = ".testdata-tmp.";

fn is_temporary(name: &std::ffi::OsStr) -> bool {
    name.to_str().is_some_and(|n| n.contains(TEMP_MARK))
}

/// Writes `bytes` to a temporary file beside `path`, then renames it onto `path`.
fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(
        ".{name}{TEMP_MARK}{}.{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    fs::write(&tmp, bytes).map_err(|e| at(&tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        at(path, e)
    })
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn at(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// zstd frame of b"hello hello hello\n" with a content checksum (zstd -19 --check).
    const HELLO: &[u8] = &[
        0x28, 0xb5, 0x2f, 0xfd, 0x04, 0x68, 0x6d, 0x00, 0x00, 0x38, 0x68, 0x65, 0x6c, 0x6c, 0x6f,
        0x20, 0x0a, 0x01, 0x00, 0x31, 0x4a, 0x11, 0xa3, 0xaa, 0x74, 0xce,
    ];

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("testdata-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn decompress_checks_the_frame() {
        assert_eq!(decompress(HELLO).unwrap(), b"hello hello hello\n");
        let mut two = HELLO.to_vec();
        two.extend_from_slice(HELLO);
        assert_eq!(decompress(&two).unwrap(), b"hello hello hello\n".repeat(2));
        let mut bad = HELLO.to_vec();
        let n = bad.len();
        bad[n - 1] ^= 1; // checksum byte
        assert!(decompress(&bad).is_err());
        assert!(decompress(&HELLO[..10]).is_err());
        assert!(decompress(b"").is_err());
        assert!(decompress(b"not zstd").is_err());
    }

    #[test]
    fn materialize_decompresses_copies_follows_links_and_prunes() {
        let root = scratch("tree");
        let src = root.join("src");
        fs::create_dir_all(src.join("a")).unwrap();
        fs::write(src.join("a/x.bin.zst"), HELLO).unwrap();
        fs::write(src.join("a/plain.txt"), "plain").unwrap();
        std::os::unix::fs::symlink("a/x.bin.zst", src.join("link.bin.zst")).unwrap();
        let dst = root.join("dst");
        fs::create_dir_all(dst.join("gone")).unwrap();
        fs::write(dst.join("stale.txt"), "old").unwrap();
        materialize(&src, &dst).unwrap();
        assert_eq!(
            fs::read(dst.join("a/x.bin")).unwrap(),
            b"hello hello hello\n"
        );
        assert_eq!(
            fs::read(dst.join("link.bin")).unwrap(),
            b"hello hello hello\n"
        );
        assert_eq!(
            fs::read_to_string(dst.join("a/plain.txt")).unwrap(),
            "plain"
        );
        assert!(!dst.join("stale.txt").exists() && !dst.join("gone").exists());
        assert!(!dst.join("a/x.bin.zst").exists());

        // A stamped copy is reused; a changed source is decompressed again.
        fs::write(dst.join("a/x.bin"), "edited").unwrap();
        materialize(&src, &dst).unwrap();
        assert_eq!(fs::read(dst.join("a/x.bin")).unwrap(), b"edited");
        let mut two = HELLO.to_vec();
        two.extend_from_slice(HELLO);
        fs::write(src.join("a/x.bin.zst"), &two).unwrap();
        materialize(&src, &dst).unwrap();
        assert_eq!(
            fs::read(dst.join("a/x.bin")).unwrap(),
            b"hello hello hello\n".repeat(2)
        );

        // Ambiguous sources and corrupt frames are errors naming the file.
        fs::write(src.join("a/x.bin"), "also plain").unwrap();
        let err = materialize(&src, &dst).unwrap_err().to_string();
        assert!(err.contains("x.bin"), "{err}");
        fs::remove_file(src.join("a/x.bin")).unwrap();
        fs::write(src.join("a/x.bin.zst"), b"junk").unwrap();
        let err = materialize(&src, &dst).unwrap_err().to_string();
        assert!(err.contains("x.bin.zst"), "{err}");
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn missing_source_is_an_error() {
        let root = scratch("missing");
        let err = materialize(&root.join("nope"), &root.join("dst")).unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
        fs::remove_dir_all(&root).unwrap();
    }
}
