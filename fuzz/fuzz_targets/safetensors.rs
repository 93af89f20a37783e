//! Any byte string as a one-shard safetensors checkpoint: opened (header validation), then every
//! tensor it accepts loaded as f32. Errors are fine; a panic or an out-of-bounds access is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use model_io::TensorStore;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("model.safetensors");
    std::fs::write(&path, data).expect("write");
    let Ok(store) = TensorStore::open_files(dir.path(), &[path]) else {
        return;
    };
    let names: Vec<String> = store.names().map(str::to_string).collect();
    for name in names {
        if let Ok(shape) = store.shape(&name).map(<[usize]>::to_vec) {
            let _ = store.load_f32(&name, &shape);
        }
    }
});
