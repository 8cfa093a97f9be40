//! GPU test: `init.dummy` (CUDA C++) vs `deltakit_ref::init::dummy`, bit for bit.
//!
//! Every case: fresh random seed / tensor id / scale / offset, output poisoned (NaN bf16, 0xFFFF)
//! before the run, canaries around the written piece, exact equality with the CPU twin. Sizes:
//! odd lengths (scalar tails), unaligned views (scalar path), 2-D column shards, full-tensor
//! indices past 2^32 and 2^40, and one tensor of more than 2^31 elements (int64 indexing end to
//! end). Prints the GB/s of a 1 GiB fill (no speed assert: timing lives in benches and prints).
mod common;

use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};
use deltakit::cudarc;
use deltakit::ops::init::{dummy, DummyDist, DummyInit, DummyRegion};
use deltakit::testing::gpu_or_skip;
use deltakit_ref::init as twin;
use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;

const POISON: bf16 = bf16::from_bits(0xFFFF); // a NaN

fn to_twin(p: &DummyInit) -> twin::DummyInit {
    twin::DummyInit {
        seed: p.seed,
        tensor_id: p.tensor_id,
        dist: match p.dist {
            DummyDist::Constant => twin::DummyDist::Constant,
            DummyDist::Uniform => twin::DummyDist::Uniform,
            DummyDist::Normal => twin::DummyDist::Normal,
            DummyDist::LogUniform => twin::DummyDist::LogUniform,
        },
        scale: p.scale,
        offset: p.offset,
    }
}

fn twin_region(r: DummyRegion) -> twin::DummyRegion {
    twin::DummyRegion { base: r.base, ld: r.ld, rows: r.rows, cols: r.cols }
}

fn random_init(rng: &mut StdRng, dist: DummyDist) -> DummyInit {
    let (scale, offset) = match dist {
        DummyDist::LogUniform => {
            let lo: f32 = rng.gen_range(0.01..4.0);
            let hi: f32 = lo + rng.gen_range(0.01..20.0);
            ((hi - lo) / 2.0, f32::midpoint(hi, lo))
        }
        _ => (rng.gen_range(-3.0..3.0), rng.gen_range(-2.0..2.0)),
    };
    DummyInit { seed: rng.gen(), tensor_id: rng.gen(), dist, scale, offset }
}

/// The twin's values of `region`, bitwise.
fn expect(p: &DummyInit, region: DummyRegion) -> Vec<u16> {
    let mut out = vec![bf16::ZERO; (region.rows * region.cols) as usize];
    twin::dummy(&to_twin(p), twin_region(region), &mut out).unwrap();
    out.iter().map(|x| x.to_bits()).collect()
}

fn bits(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Runs `dummy` into `[pad | rows*cols | pad]` poisoned, checks the piece bitwise and the pads.
fn check_case(stream: &std::sync::Arc<CudaStream>, p: &DummyInit, region: DummyRegion, pad: usize) {
    let n = (region.rows * region.cols) as usize;
    let mut buf = stream.clone_htod(&vec![POISON; n + 2 * pad]).unwrap();
    dummy(stream, p, region, &mut buf.slice_mut(pad..pad + n)).unwrap();
    let got = stream.clone_dtoh(&buf).unwrap();
    assert!(got[..pad].iter().chain(&got[pad + n..]).all(|x| x.to_bits() == 0xFFFF), "canary");
    let want = expect(p, region);
    let got = bits(&got[pad..pad + n]);
    if got != want {
        let i = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
        panic!("{p:?} {region:?} pad {pad}: element {i} is {:#06x}, twin {:#06x}", got[i], want[i]);
    }
}

#[test]
fn matches_twin_bitwise() {
    let Some(ctx) = gpu_or_skip("matches_twin_bitwise") else { return };
    let stream = ctx.default_stream();
    let dists = [DummyDist::Constant, DummyDist::Uniform, DummyDist::Normal, DummyDist::LogUniform];
    let mut case = 0u64;
    for &dist in &dists {
        // Contiguous: odd and even lengths, aligned (pad 0 / 8) and unaligned (pad 1 / 3) views.
        for &(n, pad) in &[
            (1usize, 0usize),
            (7, 0),
            (8, 8),
            (9, 1),
            (4099, 3),
            (65_541, 0),
            ((1 << 20) + 3, 8),
            (1 << 20, 1),
        ] {
            let (mut rng, seed) = common::rng(case);
            case += 1;
            let p = random_init(&mut rng, dist);
            let start = rng.gen_range(0..1u64 << 40); // full-tensor indices past 2^32
            eprintln!("case {case} seed {seed}: {dist:?} n {n} pad {pad} start {start}");
            check_case(&stream, &p, DummyRegion::contiguous(start, n as u64), pad);
        }
        // 2-D pieces: column shards with odd and multiple-of-8 widths.
        for &(rows, cols, ld) in &[(3u64, 5u64, 17u64), (64, 24, 96), (33, 1000, 4099), (2, 8, 8)] {
            let (mut rng, seed) = common::rng(case);
            case += 1;
            let p = random_init(&mut rng, dist);
            let base = rng.gen_range(0..1u64 << 33);
            eprintln!("case {case} seed {seed}: {dist:?} rows {rows} cols {cols} ld {ld}");
            check_case(&stream, &p, DummyRegion { base, ld, rows, cols }, 8);
        }
    }
}

/// A shard written with its region equals the same slice of the whole tensor on the device
/// (what makes dummy weights identical for every tensor-parallel degree).
#[test]
fn shards_equal_slices_of_the_whole() {
    let Some(ctx) = gpu_or_skip("shards_equal_slices_of_the_whole") else { return };
    let stream = ctx.default_stream();
    let (mut rng, seed) = common::rng(1000);
    let p = random_init(&mut rng, DummyDist::Uniform);
    let (r, c) = (96u64, 200u64);
    let mut full = stream.clone_htod(&vec![POISON; (r * c) as usize]).unwrap();
    dummy(&stream, &p, DummyRegion::contiguous(0, r * c), &mut full).unwrap();
    let full = stream.clone_dtoh(&full).unwrap();
    for tp in [2u64, 4, 8] {
        for rank in 0..tp {
            // Column shard (o_proj / down_proj style).
            let w = c / tp;
            let reg = DummyRegion { base: rank * w, ld: c, rows: r, cols: w };
            let mut s = stream.clone_htod(&vec![POISON; (r * w) as usize]).unwrap();
            dummy(&stream, &p, reg, &mut s).unwrap();
            let s = stream.clone_dtoh(&s).unwrap();
            for i in 0..r as usize {
                let row = &full[i * c as usize + (rank * w) as usize..][..w as usize];
                assert_eq!(&s[i * w as usize..][..w as usize], row, "seed {seed} tp {tp}");
            }
            // Row shard (gate_proj / lm_head style): a contiguous range.
            let h = r / tp;
            let reg = DummyRegion::contiguous(rank * h * c, h * c);
            let mut s = stream.clone_htod(&vec![POISON; (h * c) as usize]).unwrap();
            dummy(&stream, &p, reg, &mut s).unwrap();
            let s = stream.clone_dtoh(&s).unwrap();
            assert_eq!(&s[..], &full[(rank * h * c) as usize..][..(h * c) as usize]);
        }
    }
}

/// More than 2^31 elements in one launch: windows at the start, across 2^31, and at the end
/// equal the twin (int64 indices in the kernel and the launcher).
#[test]
fn huge_tensor_int64_indices() {
    let Some(ctx) = gpu_or_skip("huge_tensor_int64_indices") else { return };
    let stream = ctx.default_stream();
    let n: usize = (1 << 31) + (1 << 20) + 5; // 4.3 GB of bf16, odd length
    let (mut rng, seed) = common::rng(2000);
    let p = random_init(&mut rng, DummyDist::Normal);
    // SAFETY: every element is poisoned right below before anything reads it.
    let mut buf: CudaSlice<bf16> = unsafe { stream.alloc(n) }.unwrap();
    {
        let (ptr, _g) = buf.device_ptr_mut(&stream);
        // SAFETY: `ptr` is the live allocation of n bf16 on this stream's context.
        unsafe { cudarc::driver::result::memset_d8_async(ptr, 0xFF, 2 * n, stream.cu_stream()) }
            .unwrap();
    }
    dummy(&stream, &p, DummyRegion::contiguous(0, n as u64), &mut buf).unwrap();
    let mut windows = vec![0usize, (1 << 31) - 4096, (1 << 32) / 2 + 12_345, n - 4096];
    windows.extend((0..8).map(|_| rng.gen_range(0..n - 4096)));
    for start in windows {
        let got = stream.clone_dtoh(&buf.slice(start..start + 4096)).unwrap();
        let want = expect(&p, DummyRegion::contiguous(start as u64, 4096));
        assert_eq!(bits(&got), want, "seed {seed}: window at {start}");
    }
}

/// Bad arguments are typed errors naming the argument, and nothing is written.
#[test]
fn rejects_bad_arguments_without_writing() {
    let Some(ctx) = gpu_or_skip("rejects_bad_arguments_without_writing") else { return };
    let stream = ctx.default_stream();
    let mut out = stream.clone_htod(&[POISON; 16]).unwrap();
    let good =
        DummyInit { seed: 1, tensor_id: 2, dist: DummyDist::Uniform, scale: 1.0, offset: 0.0 };
    let all = DummyRegion::contiguous(0, 16);
    for (p, reg, arg) in [
        (good, DummyRegion::contiguous(0, 15), "out"),
        (good, DummyRegion { base: 0, ld: 4, rows: 2, cols: 8 }, "region"),
        (good, DummyRegion::contiguous(i64::MAX as u64 - 8, 16), "region"),
        (DummyInit { scale: f32::NAN, ..good }, all, "scale"),
        (DummyInit { offset: f32::INFINITY, ..good }, all, "offset"),
        (DummyInit { dist: DummyDist::Normal, scale: 1e38, ..good }, all, "scale"),
        (DummyInit { dist: DummyDist::LogUniform, scale: 2.0, offset: 1.0, ..good }, all, "offset"),
    ] {
        let e = dummy(&stream, &p, reg, &mut out).unwrap_err();
        assert!(matches!(e, deltakit::Error::Shape { arg: a, .. } if a == arg), "{arg}: {e}");
    }
    let got = stream.clone_dtoh(&out).unwrap();
    assert!(got.iter().all(|x| x.to_bits() == 0xFFFF), "written on an error path");
}

/// Throughput of a 1 GiB uniform fill (printed; the write floor is 1 GiB / 4.25 TB/s = 0.25 ms).
#[test]
fn fill_1gib_throughput_print() {
    let Some(ctx) = gpu_or_skip("fill_1gib_throughput_print") else { return };
    let stream = ctx.default_stream();
    let n: usize = 1 << 29;
    let mut buf = stream.alloc_zeros::<bf16>(n).unwrap();
    let p = DummyInit { seed: 3, tensor_id: 4, dist: DummyDist::Uniform, scale: 0.02, offset: 0.0 };
    let reg = DummyRegion::contiguous(0, n as u64);
    dummy(&stream, &p, reg, &mut buf).unwrap(); // warm-up
    stream.synchronize().unwrap();
    for (dist, scale, offset) in [
        (DummyDist::Uniform, 0.02, 0.0),
        (DummyDist::Normal, 0.02, 0.0),
        (DummyDist::LogUniform, 7.5, 8.5),
        (DummyDist::Constant, 0.0, 1.0),
    ] {
        let p = DummyInit { dist, scale, offset, ..p };
        let iters = 20;
        let t = Instant::now();
        for _ in 0..iters {
            dummy(&stream, &p, reg, &mut buf).unwrap();
        }
        stream.synchronize().unwrap();
        let s = t.elapsed().as_secs_f64() / f64::from(iters);
        let gbs = (2 * n) as f64 / s / 1e9;
        eprintln!(
            "init.dummy 1 GiB bf16 {dist:?}: {:.3} ms, {gbs:.0} GB/s ({:.2} of 4250 GB/s)",
            s * 1e3,
            gbs / 4250.0
        );
    }
    // The fill is real: spot-check against the twin.
    let got = stream.clone_dtoh(&buf.slice(n - 1000..n)).unwrap();
    let p = DummyInit { dist: DummyDist::Constant, scale: 0.0, offset: 1.0, ..p };
    assert_eq!(bits(&got), expect(&p, DummyRegion::contiguous((n - 1000) as u64, 1000)));
}
