//! Device resolution on this machine (CI has no GPU), the host head GPU models lend their drafters
//! (against the CPU engine's embeddings and LM head, tied and untied), and the dispatch guards.

use device::{Device, Model, ModelSnapshot, ModelState, Placement};
use families::{Backend, BackendState, Wanted};
use model_io::Checkpoint;

fn checkpoint(name: &str) -> Checkpoint {
    Checkpoint::open(&testdata::fixture(name)).unwrap()
}

#[test]
fn device_names_parse_and_print() {
    for (text, device) in [
        ("cpu", Device::Cpu),
        ("CUDA", Device::Cuda),
        ("gpu", Device::Cuda),
        (" auto ", Device::Auto),
        ("cuda-emulated", Device::CudaEmulated),
    ] {
        let parsed: Device = text.parse().unwrap();
        assert_eq!(parsed, device, "{text}");
        assert_eq!(parsed.to_string().parse::<Device>().unwrap(), device);
    }
    let err = "tpu".parse::<Device>().unwrap_err().to_string();
    assert!(
        err.contains("\"tpu\"") && err.contains("cpu, cuda or auto"),
        "{err}"
    );
    assert_eq!(Device::default(), Device::Auto);
}

#[test]
fn resolution_follows_the_machine() {
    assert!(matches!(
        Device::Cpu.resolve().unwrap().placement,
        Placement::Cpu
    ));
    assert!(Device::CudaEmulated.resolve().unwrap().placement.is_cuda());
    // As on a machine without a driver, wherever this runs (debug_env.rs; read once per process, and
    // this test binary's other tests do not open a GPU).
    std::env::set_var("TURBOSPARK_CUDA_DRIVER", "none");
    assert!(!cuda_backend::driver_present());
    let auto = Device::Auto.resolve().unwrap();
    assert!(
        !auto.placement.is_cuda() && auto.note.is_none(),
        "auto is silent without a driver"
    );
    match Device::Cuda.resolve() {
        Ok(_) => panic!("cuda resolved without a driver"),
        Err(families::BackendError::Device(e)) => {
            assert!(device::is_unavailable(e.as_ref()), "{e}");
            assert!(!e.to_string().contains('\n'), "one line: {e}");
        }
        Err(e) => panic!("not a device error: {e}"),
    }
}

/// What drafters of a GPU model read (embedding rows, LM head) is the CPU engine's, bit for bit.
#[test]
fn host_head_equals_the_cpu_engine_head() {
    for name in ["qwen3", "qwen3_5"] {
        let ck = checkpoint(name);
        let cpu = Model::load(&ck, Device::Cpu).unwrap().model;
        let gpu = Model::load(&ck, Device::CudaEmulated).unwrap().model;
        assert_eq!(cpu.device_name(), "cpu");
        assert_eq!(gpu.device_name(), "cuda (host emulation)");
        let (a, b) = (cpu.head(&ck).unwrap(), gpu.head(&ck).unwrap());
        assert_eq!(
            (a.hidden(), a.vocab(), a.num_layers()),
            (b.hidden(), b.vocab(), b.num_layers())
        );
        let h = a.hidden();
        for token in [0, 7, a.vocab() as u32 - 1] {
            assert_eq!(a.embed_row(token), b.embed_row(token), "{name} row {token}");
        }
        assert!(b.embed_row(a.vocab() as u32).is_none());
        let rows: Vec<f32> = (0..3 * h)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let (la, lb) = (a.lm_head(&rows, 3), b.lm_head(&rows, 3));
        assert_eq!(la.len(), 3 * a.vocab());
        assert!(
            la.iter().zip(&lb).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{name}"
        );
    }
}

/// The enum dispatches to the device that made the state; anything else is an error, not a panic.
#[test]
fn states_and_snapshots_stay_on_their_device() {
    let ck = checkpoint("qwen3_5");
    let cpu = Model::load(&ck, Device::Cpu).unwrap().model;
    let gpu = Model::load(&ck, Device::CudaEmulated).unwrap().model;
    let mut cs = cpu.new_state().unwrap();
    let mut gs = gpu.new_state().unwrap();
    assert!(matches!(cs, ModelState::Cpu(_)) && matches!(gs, ModelState::Cuda(_)));
    let prompt = [5, 17, 300, 2];
    let c = cpu.forward(&prompt, 0, &mut cs, &Wanted::last()).unwrap();
    let g = gpu.forward(&prompt, 0, &mut gs, &Wanted::last()).unwrap();
    // bf16 weights on the GPU: close to the CPU engine, not equal.
    let d = c
        .logits
        .iter()
        .zip(&g.logits)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    assert!(d < 0.5, "max |Δ| {d}");
    assert!(gpu.forward(&[1], 4, &mut cs, &Wanted::last()).is_err());
    assert!(cpu.begin_tape(&mut gs).is_err());
    let snap = cs.save().unwrap();
    assert!(matches!(snap, ModelSnapshot::Cpu(_)));
    assert!(gs.restore(&snap).is_err());
    // Save / restore on the device returns to the saved position and continues identically.
    let gsnap = gs.save().unwrap();
    let a = gpu.forward(&[9, 10], 4, &mut gs, &Wanted::all()).unwrap();
    gs.restore(&gsnap).unwrap();
    assert_eq!(gs.position(), 4);
    let b = gpu.forward(&[9, 10], 4, &mut gs, &Wanted::all()).unwrap();
    assert_eq!(a.logits, b.logits);
}

/// A GPU model says how it runs decode steps, and why a faster path is off (the emulated device has no
/// segment kernel and launches nothing programmatically); a CPU model names its kernels' instruction sets.
#[test]
fn models_report_their_decode_paths() {
    let ck = checkpoint("qwen3_5");
    let cpu = Model::load(&ck, Device::Cpu).unwrap().model.device_notes();
    assert_eq!(cpu, Some(format!("cpu kernels: {}", kernels::simd_path())));
    let gpu = Model::load(&ck, Device::CudaEmulated).unwrap().model;
    let notes = gpu.device_notes().unwrap();
    assert!(notes.contains("programmatic launch off"), "{notes}");
    assert!(notes.contains("GEMV segments off ("), "{notes}");
    let chained = if std::env::var("TURBOSPARK_CHAIN").as_deref() == Ok("0") {
        "greedy steps one at a time"
    } else {
        "greedy steps chained"
    };
    assert!(notes.contains(chained), "{notes}");
}
