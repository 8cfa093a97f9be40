//! GPU test: `DELTAKIT_GDR_SPLIT_VARIANT` set to a number that is not a variant of the split
//! pipeline (session 11). `gdr.chunk_prefill` reads the variable once per process, so this binary
//! holds this one test and sets the variable before its first call. On a compute-capability 9.0
//! device of a build with `90a` (the default) the call fails with [`deltakit::Error::Shape`]
//! naming the variable, before anything is enqueued: the output (NaN-poisoned) and the state pool
//! are untouched. Where the split pipeline cannot run the value is ignored (a note on stderr) and
//! the Triton pipeline runs. Text that is not an integer is checked on the CPU
//! (`chunk_prefill::tests::split_variant_text_is_parsed_strictly`).

use deltakit::cudarc::driver::CudaSlice;
use deltakit::ops::gdr::chunk_prefill::{
    chunk_prefill, workspace_bytes, ChunkPrefillInputs, ChunkPrefillStrides, Gating, HostCopies,
    InitialState,
};
use deltakit::ops::gdr::{GdrDims, GdrOptions};
use deltakit::testing::gpu_or_skip;
use half::bf16;

/// Not in `split_variant_known` (csrc/gdr/chunk_prefill_fused_sm90.cu).
const UNKNOWN_VARIANT: &str = "12345";

#[test]
fn unknown_split_variant_is_a_typed_error_naming_the_variable() {
    // Before anything in this process can have read it (single-test binary).
    std::env::set_var("DELTAKIT_GDR_SPLIT_VARIANT", UNKNOWN_VARIANT);
    let Some(ctx) = gpu_or_skip("unknown_split_variant_is_a_typed_error_naming_the_variable")
    else {
        return;
    };
    let stream = ctx.new_stream().unwrap();
    let up_bf = |x: &[bf16]| -> CudaSlice<bf16> { stream.clone_htod(x).unwrap() };
    let d = GdrDims { h_k: 2, h_v: 4, k: 128, v: 128 };
    let t = 10;
    let q = up_bf(&vec![bf16::from_f32(0.5); t * 2 * 128]);
    let v = up_bf(&vec![bf16::from_f32(0.25); t * 4 * 128]);
    let g = stream.clone_htod(&vec![-0.1f32; t * 4]).unwrap();
    let cu = stream.clone_htod(&[0i32, 10]).unwrap();
    let slots = stream.clone_htod(&[0i32]).unwrap();
    let st0 = vec![0.125f32; d.state_per_slot()];
    let mut st = stream.clone_htod(&st0).unwrap();
    let mut out = up_bf(&vec![bf16::NAN; t * 4 * 128]);
    let mut ws = stream.clone_htod(&vec![0u8; workspace_bytes(d, t, 1)]).unwrap();
    let inputs = ChunkPrefillInputs {
        q: q.as_view(),
        k: q.as_view(),
        v: v.as_view(),
        gating: Gating::Precomputed { g: g.as_view(), beta: g.as_view() },
        cu_seqlens: cu.as_view(),
        slots: slots.as_view(),
        initial_state: InitialState::FromSlots,
    };
    let r = chunk_prefill(
        &stream,
        d,
        GdrOptions::default(),
        ChunkPrefillStrides::default(),
        &inputs,
        HostCopies::default(),
        &mut st,
        &mut out,
        &mut ws,
    );
    stream.synchronize().unwrap();
    let cc = ctx.compute_capability().unwrap();
    match r {
        Err(deltakit::Error::Shape { arg: "DELTAKIT_GDR_SPLIT_VARIANT", got, .. }) => {
            assert_eq!(got, UNKNOWN_VARIANT);
            assert!(stream.clone_dtoh(&out).unwrap().iter().all(|x| x.is_nan()), "out written");
            assert_eq!(stream.clone_dtoh(&st).unwrap(), st0, "state written on the error path");
        }
        Ok(()) => {
            // Only where the split pipeline cannot run (then the Triton pipeline ran).
            assert_ne!(
                cc,
                (9, 0),
                "an unknown split variant ran on a compute-capability 9.0 device"
            );
            assert!(stream.clone_dtoh(&out).unwrap().iter().all(|x| x.is_finite()));
        }
        Err(e) => panic!("expected Error::Shape naming DELTAKIT_GDR_SPLIT_VARIANT, got {e}"),
    }
}
