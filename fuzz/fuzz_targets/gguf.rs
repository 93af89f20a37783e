//! Any byte string through the GGUF reader, then every tensor it accepts through dequantization:
//! errors are fine, a panic, an out-of-bounds access or an allocation the file cannot justify is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use model_io::gguf::{reader, types};

fuzz_target!(|data: &[u8]| {
    let Ok(parsed) = reader::parse(data) else {
        return;
    };
    for t in &parsed.tensors {
        let Some(bytes) = data.get(t.begin..t.end) else {
            panic!("tensor `{}`: accepted range {}..{} outside the image", t.name, t.begin, t.end);
        };
        if t.ggml_type.block_bytes() == 0 {
            continue;
        }
        let values = bytes.len() / t.ggml_type.block_bytes() * t.ggml_type.block_len();
        let mut out = vec![0f32; values];
        let _ = types::dequantize(t.ggml_type, bytes, &mut out);
    }
});
