//! Engine behaviour beyond the golden numbers: typed errors on bad checkpoints and requests,
//! sharded checkpoints, dummy weights, pool bookkeeping, sampling, stop tokens, and the CLI.

use std::path::{Path, PathBuf};

use deltakit_engine::config::ModelConfig;
use deltakit_engine::generate::{cpu, GenOptions, Request, SamplingParams, StepItem, Want};
use deltakit_engine::state::CacheConfig;
use deltakit_engine::EngineError;

fn fixture(name: &str) -> PathBuf {
    deltakit_engine::paths::find_fixtures_dir()
        .expect("tests/fixtures not found in the cwd or its parents")
        .join(name)
}

/// A fresh scratch directory under the system temp dir, removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

fn scratch(tag: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("deltakit-engine-test-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

/// Copy the tiny-causal checkpoint into a scratch dir with an edited config.
fn edited_model(tag: &str, edit: impl FnOnce(&mut serde_json::Value)) -> Scratch {
    let src = fixture("tiny-causal");
    let d = scratch(tag);
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(src.join("model.safetensors"), d.join("model.safetensors")).unwrap();
    d
}

fn cache() -> CacheConfig {
    CacheConfig::for_sequences(2, 64, 16)
}

fn load_err(dir: &Path) -> String {
    match cpu::load(dir, cache(), false) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_tensor_is_named() {
    let d = edited_model("missing", |c| {
        c["num_hidden_layers"] = 9.into();
        c["layer_types"].as_array_mut().unwrap().push("linear_attention".into());
    });
    let e = load_err(&d);
    assert!(e.contains("missing tensor `model.layers.8.input_layernorm.weight`"), "{e}");
}

#[test]
fn misshaped_tensor_is_named_with_shapes() {
    let d = edited_model("shape", |c| c["intermediate_size"] = 256.into());
    let e = load_err(&d);
    assert!(
        e.contains("`model.layers.0.mlp.gate_proj.weight`")
            && e.contains("[128, 64]")
            && e.contains("[256, 64]"),
        "{e}"
    );
}

#[test]
fn moe_config_is_rejected_naming_the_field() {
    let d = edited_model("moe", |c| c["num_experts"] = 64.into());
    let e = load_err(&d);
    assert!(e.contains("`num_experts`"), "{e}");
}

#[test]
fn sharded_index_loads_the_same_model() {
    let src = fixture("tiny-causal");
    let d = scratch("sharded");
    std::fs::copy(src.join("config.json"), d.join("config.json")).unwrap();
    std::fs::copy(src.join("model.safetensors"), d.join("model-00001-of-00001.safetensors"))
        .unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let map: serde_json::Map<String, serde_json::Value> = meta
        .tensors()
        .keys()
        .map(|k| (k.clone(), "model-00001-of-00001.safetensors".into()))
        .collect();
    std::fs::write(
        d.join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    let prompt = [312u32, 349, 330, 76];
    let run = |dir: &Path| {
        let mut e = cpu::load(dir, cache(), false).unwrap();
        let s = e.add_sequence().unwrap();
        e.step(&[StepItem { seq: s, tokens: &prompt, want: Want::Last }]).unwrap().data
    };
    assert_eq!(run(&d), run(&src));
}

#[test]
fn bad_requests_are_errors_not_panics() {
    let mut e =
        cpu::load(&fixture("tiny-causal"), CacheConfig::for_sequences(1, 12, 4), false).unwrap();
    let req = |prompt: Vec<u32>| Request { prompt, params: SamplingParams::default() };
    let opts = GenOptions::default();
    let err = e.generate(&[req(vec![1, 999])], opts, &mut |_| {}).unwrap_err();
    assert!(matches!(err, EngineError::Request(_)) && err.to_string().contains("999"), "{err}");
    let err = e.generate(&[req(vec![5; 13])], opts, &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("maximum context"), "{err}");
    let err = e.generate(&[req(vec![])], opts, &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("empty prompt"), "{err}");
    // A sequence that reaches the context limit finishes instead of failing.
    let (out, _) = e
        .generate(
            &[Request {
                prompt: vec![5; 10],
                params: SamplingParams { max_tokens: 100, ..SamplingParams::default() },
            }],
            opts,
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(out[0].tokens.len(), 3);
    // Step-level misuse.
    let s = e.add_sequence().unwrap();
    assert!(e.add_sequence().is_err(), "only one slot");
    let two = [1u32, 2];
    let err = e
        .step(&[
            StepItem { seq: s, tokens: &two, want: Want::Last },
            StepItem { seq: s, tokens: &two, want: Want::Last },
        ])
        .unwrap_err();
    assert!(err.to_string().contains("twice"), "{err}");
    e.end_sequence(s).unwrap();
    assert!(e.end_sequence(s).is_err());
    assert_eq!(e.num_sequences(), 0);
}

/// Session 11: a step whose sequences together need more KV pages than are free fails as a
/// whole, before any page is taken (an earlier item used to keep the pages reserved for it).
#[test]
fn step_page_shortage_takes_no_pages() {
    let cache = CacheConfig { max_seqs: 2, num_pages: 3, page_size: 4, max_context: 12 };
    let mut e = cpu::load(&fixture("tiny-causal"), cache, false).unwrap();
    let (a, b) = (e.add_sequence().unwrap(), e.add_sequence().unwrap());
    let eight = [5u32; 8];
    let err = e
        .step(&[
            StepItem { seq: a, tokens: &eight, want: Want::Nothing },
            StepItem { seq: b, tokens: &eight, want: Want::Nothing },
        ])
        .unwrap_err();
    assert!(matches!(err, EngineError::Capacity(_)), "{err}");
    assert_eq!((e.seq_len(a), e.seq_len(b)), (Some(0), Some(0)));
    // Every page is still free: b alone can take all three.
    e.step(&[StepItem { seq: b, tokens: &[5u32; 12], want: Want::Last }]).unwrap();
    assert_eq!(e.seq_len(b), Some(12));
}

#[test]
fn stop_tokens_and_seeded_sampling() {
    let mut e = cpu::load(&fixture("tiny-causal"), cache(), false).unwrap();
    let prompt = vec![312u32, 349, 330, 76, 84, 65, 342, 267];
    // HF's greedy continuation starts 176, 150, 226: stop at 226.
    let params = SamplingParams { stop_tokens: vec![226], ..SamplingParams::default() };
    let (out, _) = e
        .generate(&[Request { prompt: prompt.clone(), params }], GenOptions::default(), &mut |_| {})
        .unwrap();
    assert_eq!(out[0].tokens, vec![176, 150, 226]);
    assert_eq!(out[0].reason, deltakit_engine::generate::FinishReason::Stop);
    let mut sampled = |seed| {
        let params = SamplingParams {
            temperature: 0.8,
            top_p: 0.9,
            seed,
            max_tokens: 16,
            ..SamplingParams::default()
        };
        let req = Request { prompt: prompt.clone(), params };
        e.generate(&[req], GenOptions::default(), &mut |_| {}).unwrap().0[0].tokens.clone()
    };
    let (a, b, c) = (sampled(1), sampled(1), sampled(2));
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn dummy_weights_from_config_alone() {
    let cfg = ModelConfig::from_path(&fixture("tiny-cond")).unwrap();
    let mut e = cpu::dummy(&cfg, 7, CacheConfig::for_sequences(4, 48, 16)).unwrap();
    let reqs: Vec<Request> = (0..4u32)
        .map(|i| Request {
            prompt: (0..8 + i * 5).map(|t| (t * 7 + i) % 384).collect(),
            params: SamplingParams { max_tokens: 8, ..SamplingParams::default() },
        })
        .collect();
    let (out, stats) = e.generate(&reqs, GenOptions::default(), &mut |_| {}).unwrap();
    assert!(out.iter().all(|c| c.tokens.len() == 8));
    assert_eq!(stats.prefill_tokens, 8 + 13 + 18 + 23);
    assert_eq!(stats.decode_steps, 7);
    // Same seed, same logits.
    let mut e2 = cpu::dummy(&cfg, 7, CacheConfig::for_sequences(4, 48, 16)).unwrap();
    let (out2, _) = e2.generate(&reqs, GenOptions::default(), &mut |_| {}).unwrap();
    let toks = |v: &[deltakit_engine::generate::Completion]| {
        v.iter().map(|c| c.tokens.clone()).collect::<Vec<_>>()
    };
    assert_eq!(toks(&out), toks(&out2));
}

/// The CLI's README command, when the binary is where cargo built it (skipped in copied
/// bundles, which carry no binary at that path).
#[test]
fn cli_generate_on_the_bundled_model() {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_deltakit"));
    if !exe.is_file() {
        eprintln!("SKIP cli test: {} not found", exe.display());
        return;
    }
    let root = fixture("tiny-causal");
    let out = std::process::Command::new(&exe)
        .args(["generate", "--prompt", "The gated delta rule", "--max-tokens", "8"])
        .current_dir(root.parent().unwrap())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("The gated delta rule"), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("tok/s") && stderr.contains("ttft"), "{stderr}");
    // --json --logprobs: one object per prompt position and generated token.
    let out = std::process::Command::new(&exe)
        .args([
            "generate",
            "--token-ids",
            "312,349,330",
            "--max-tokens",
            "4",
            "--json",
            "--logprobs",
            "5",
        ])
        .current_dir(root.parent().unwrap())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = lines.iter().map(|l| l["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "prompt").count(), 3);
    assert_eq!(kinds.iter().filter(|k| **k == "token").count(), 4);
    assert_eq!(lines[0]["top_logprobs"].as_array().unwrap().len(), 5);
}

/// The bf16 CPU backend (HF bf16 rounding points emulated) runs the same model code. bf16 noise
/// is amplified by these tiny random models (HF's own bf16 and f32 goldens differ by up to 0.5 in
/// log-probability), so the check is HF bf16's greedy tokens on the fixture with wide top-2 gaps.
#[test]
fn bf16_backend_reproduces_hf_bf16_greedy_on_tiny_tied() {
    let dir = fixture("tiny-tied");
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden_bf16.json")).unwrap())
            .unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
    };
    let mut e = cpu::load_as::<half::bf16>(&dir, cache(), false).unwrap();
    assert_eq!(e.backend_name(), "cpu-bf16");
    for case in golden["cases"].as_array().unwrap() {
        let want = ids(&case["greedy_tokens"]);
        let req = Request {
            prompt: ids(&case["prompt_ids"]),
            params: SamplingParams { max_tokens: want.len(), ..SamplingParams::default() },
        };
        let (out, _) = e.generate(&[req], GenOptions::default(), &mut |_| {}).unwrap();
        assert_eq!(out[0].tokens, want);
    }
}

/// Session 11: `decode_sample` with a top-K larger than the vocabulary is refused before the
/// forward step runs (it used to run the step, advancing the sequence's GDN state and writing its
/// KV row, and only then fail in the sampler: the next step saw a corrupted state).
#[test]
fn decode_sample_checks_top_k_before_running() {
    use deltakit_engine::generate::RowSampling;
    let run = |bad_first: bool| {
        let mut e = cpu::load(&fixture("tiny-causal"), cache(), false).unwrap();
        let vocab = e.config().vocab_size;
        let s = e.add_sequence().unwrap();
        e.step(&[StepItem { seq: s, tokens: &[5, 6, 7], want: Want::Nothing }]).unwrap();
        let row = RowSampling::of(&SamplingParams::default(), 0);
        if bad_first {
            let bad = RowSampling { topk: vocab + 1, ..row.clone() };
            let err =
                e.decode_sample(&[StepItem { seq: s, tokens: &[8], want: Want::Last }], &[bad]);
            let err = err.unwrap_err();
            assert!(matches!(&err, EngineError::Request(m) if m.contains("top")), "{err}");
            assert_eq!(e.seq_len(s), Some(3));
        }
        let ok = RowSampling { topk: 3, ..row };
        e.decode_sample(&[StepItem { seq: s, tokens: &[8], want: Want::Last }], &[ok]).unwrap()
    };
    assert_eq!(run(true), run(false));
}

/// Session 11 (robust2): `decode_sample` refuses rows whose temperature / top_p
/// `SamplingParams::validate` refuses (top_p 0 / NaN / -1 / 2 acted as 1, a NaN temperature as
/// greedy, an infinite one sampled), naming the field and the row, before the forward step:
/// the sequence is not advanced and the next good step gives the same token as without it.
#[test]
fn decode_sample_validates_rows_before_running() {
    use deltakit_engine::generate::RowSampling;
    let bad_rows = {
        let row = RowSampling::of(&SamplingParams::default(), 0);
        let t =
            [f32::NAN, f32::INFINITY, -1.0].map(|t| RowSampling { temperature: t, ..row.clone() });
        let p = [0.0, f32::NAN, -1.0, 2.0].map(|p| RowSampling { top_p: p, ..row.clone() });
        t.into_iter().map(|r| ("temperature", r)).chain(p.into_iter().map(|r| ("top_p", r)))
    };
    let run = |bad: Option<(&str, RowSampling)>| {
        let mut e = cpu::load(&fixture("tiny-causal"), cache(), false).unwrap();
        let s = e.add_sequence().unwrap();
        e.step(&[StepItem { seq: s, tokens: &[5, 6, 7], want: Want::Nothing }]).unwrap();
        let item = [StepItem { seq: s, tokens: &[8], want: Want::Last }];
        if let Some((name, r)) = bad {
            let err = e.decode_sample(&item, &[r]).unwrap_err();
            assert!(
                matches!(&err, EngineError::Request(m) if m.starts_with(&format!("sampling row 0: {name}"))),
                "{err}"
            );
            assert_eq!(e.seq_len(s), Some(3));
        }
        e.decode_sample(&item, &[RowSampling::of(&SamplingParams::default(), 0)]).unwrap()
    };
    let want = run(None);
    for bad in bad_rows {
        assert_eq!(run(Some(bad)), want);
    }
}

/// Session 11 (robust2): `--logprobs 0` is refused naming the flag, with a message that says
/// what leaving it out does (`--json` alone prints top-1 lists), whether or not `--json` is
/// given; `--json` alone does print top-1 lists (prompt and token records), and the library
/// gives prompt events top-1 lists with `logprobs: None` (as documented).
#[test]
fn cli_logprobs_zero_and_json_default() {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_deltakit"));
    if !exe.is_file() {
        eprintln!("SKIP cli test: {} not found", exe.display());
        return;
    }
    let root = fixture("tiny-causal");
    let cli = |extra: &[&str]| {
        let mut args = vec!["generate", "--token-ids", "312,349,330", "--max-tokens", "2"];
        args.extend_from_slice(extra);
        std::process::Command::new(&exe)
            .args(&args)
            .current_dir(root.parent().unwrap())
            .output()
            .unwrap()
    };
    for extra in [&["--logprobs", "0"][..], &["--logprobs", "0", "--json"][..]] {
        let out = cli(extra);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?}");
        assert!(
            stderr.contains("--logprobs 0 must be >= 1") && stderr.contains("top-1"),
            "{stderr}"
        );
    }
    let out = cli(&["--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let lists: Vec<_> = lines.iter().filter(|l| l["kind"] != "finished").collect();
    assert_eq!(lists.iter().filter(|l| l["kind"] == "prompt").count(), 3);
    assert!(lists.len() > 3, "{lines:?}");
    assert!(lists.iter().all(|l| l["top_logprobs"].as_array().unwrap().len() == 1), "{lines:?}");
    // The library: prompt events carry top-1 lists with logprobs None.
    let mut e = cpu::load(&fixture("tiny-causal"), cache(), false).unwrap();
    let params =
        SamplingParams { max_tokens: 1, prompt_logprobs: true, ..SamplingParams::default() };
    let mut prompt_k = Vec::new();
    let mut token_topk = Vec::new();
    e.generate(
        &[Request { prompt: vec![312, 349, 330], params }],
        GenOptions::default(),
        &mut |ev| match ev {
            deltakit_engine::generate::Event::Prompt { topk, .. } => prompt_k.push(topk.len()),
            deltakit_engine::generate::Event::Token { topk, .. } => token_topk.push(topk),
            deltakit_engine::generate::Event::Finished { .. } => {}
        },
    )
    .unwrap();
    assert_eq!((prompt_k, token_topk), (vec![1, 1, 1], vec![None]));
}
