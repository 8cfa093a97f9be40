//! End to end: a small generated JSONL (4 to 10 options) evaluated on the bundled tiny model
//! (random weights: the scores are meaningless, the run must complete and write well-formed
//! results), through the library and through the `deltakit eval-mc` binary, including
//! `--rerun-truncated`.

use std::path::{Path, PathBuf};

use deltakit_engine::eval::{self, report, EvalOptions, ItemResult, Summary, Template};
use deltakit_engine::generate::cpu;
use deltakit_engine::state::CacheConfig;
use deltakit_engine::tokenizer::Tokenizer;

fn tiny_model() -> PathBuf {
    deltakit_engine::paths::find_fixtures_dir()
        .expect("tests/fixtures not found in the cwd or its parents")
        .join("tiny-causal")
}

/// A fresh scratch directory under the system temp dir, removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(tag: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("deltakit-eval-e2e-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

/// Six items with 4, 5, 6, 8, 9 and 10 options; ids mixed (strings, numbers, default).
fn write_data(dir: &Path) -> PathBuf {
    let counts = [4usize, 5, 6, 8, 9, 10];
    let mut text = String::new();
    for (i, &n) in counts.iter().enumerate() {
        let options: Vec<String> = (0..n).map(|k| format!("option {k} of item {i}")).collect();
        let mut v = serde_json::json!({
            "question": format!("Which option is right for item {i}?"),
            "options": options,
        });
        match i % 3 {
            0 => v["id"] = format!("item-{i}").into(),
            1 => v["id"] = (100 + i).into(),
            _ => {} // default id: the line index
        }
        if i % 2 == 0 {
            v["answer"] = char::from(b'A' + (i % n) as u8).to_string().into();
        } else {
            v["answer_index"] = (n - 1).into();
        }
        text.push_str(&v.to_string());
        text.push('\n');
    }
    let p = dir.join("mc.jsonl");
    std::fs::write(&p, text).unwrap();
    p
}

const FIELDS: [&str; 11] = [
    "id",
    "completion",
    "extracted",
    "gold",
    "correct",
    "truncated",
    "truncated_by",
    "item_hash",
    "max_tokens",
    "completion_tokens",
    "method",
];

/// Every line is a JSON object with all fields of the right types; returns the parsed results.
fn check_results_file(path: &Path, n: usize) -> Vec<ItemResult> {
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), n, "{text}");
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        for f in FIELDS {
            assert!(v.get(f).is_some(), "field {f} missing in {l}");
        }
        assert!(v["id"].is_string() || v["id"].is_number(), "{l}");
        assert!(v["completion"].is_string() && v["method"].is_string(), "{l}");
        assert!(v["correct"].is_boolean() && v["truncated"].is_boolean(), "{l}");
        assert!(v["max_tokens"].is_u64() && v["completion_tokens"].is_u64(), "{l}");
        let ex = v["extracted"].as_str().unwrap();
        assert!(ex == "unanswered" || (ex.len() == 1 && ("A"..="J").contains(&ex)), "{l}");
        let gold = v["gold"].as_str().unwrap();
        assert_eq!(v["correct"].as_bool().unwrap(), ex == gold, "{l}");
    }
    report::parse_results(&text).unwrap()
}

/// Counts finished sequences and scored items.
struct Count(usize, usize);
impl eval::Observer for Count {
    fn sequence_finished(&mut self) {
        self.0 += 1;
    }
    fn item_done(&mut self, _: &ItemResult) -> Result<(), eval::EvalError> {
        self.1 += 1;
        Ok(())
    }
}

#[test]
fn library_eval_and_rerun_on_the_tiny_model() {
    let dir = scratch("lib");
    let data = write_data(&dir.0);
    let items = eval::load_jsonl(&data).unwrap();
    assert_eq!(items.len(), 6);
    assert_eq!(items[2].key(), "2");
    assert_eq!(items[3].gold_letter(), 'H');
    let model = tiny_model();
    let tok = Tokenizer::from_path(&model).unwrap();
    let prompts = eval::encode_prompts(&tok, &items, Template::Plain).unwrap();
    let longest = prompts.iter().map(Vec::len).max().unwrap();
    let mut engine =
        cpu::load(&model, CacheConfig::for_sequences(4, longest + 12, 16), false).unwrap();
    let eos = engine.config().eos_token_ids.clone();
    let opts = EvalOptions {
        max_tokens: 6,
        batch: 4,
        stop_tokens: eval::stop_tokens(&tok, &eos, Template::Plain),
        ..EvalOptions::default()
    };
    let mut count = Count(0, 0);
    let results = eval::evaluate(&mut engine, &tok, &items, &prompts, &opts, &mut count).unwrap();
    assert_eq!((count.0, count.1, results.len()), (6, 6, 6));
    for (it, r) in items.iter().zip(&results) {
        assert_eq!(r.key(), it.key());
        assert_eq!(r.gold, it.gold_letter().to_string());
        assert_eq!(r.max_tokens, 6);
        assert!(r.completion_tokens <= 6);
        assert_eq!(r.truncated, r.completion_tokens == 6 && !r.completion.contains("\nQuestion:"));
    }
    let out = dir.0.join("results.jsonl");
    report::write_results(&out, &results).unwrap();
    assert_eq!(check_results_file(&out, 6), results);
    let s = Summary::of(&results);
    assert_eq!(s.n, 6);
    assert!(s.ci95.0 <= s.accuracy && s.accuracy <= s.ci95.1);

    // Rerun the truncated items with a larger budget and merge.
    let todo = eval::select_truncated(&items, &results, 10).unwrap();
    assert_eq!(todo.len(), s.truncated);
    let p2 = eval::encode_prompts(&tok, &todo, Template::Plain).unwrap();
    let fresh = eval::evaluate(
        &mut engine,
        &tok,
        &todo,
        &p2,
        &EvalOptions { max_tokens: 10, ..opts.clone() },
        &mut (),
    )
    .unwrap();
    let merged = eval::merge(results.clone(), fresh);
    assert_eq!(merged.len(), 6);
    for (old, new) in results.iter().zip(&merged) {
        assert_eq!(old.key(), new.key());
        assert_eq!(new.max_tokens, if old.truncated { 10 } else { 6 });
    }
    // A budget that is not larger is refused.
    if s.truncated > 0 {
        assert!(eval::select_truncated(&items, &results, 6).is_err());
    }
}

#[test]
fn cli_eval_mc_and_rerun() {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_deltakit"));
    if !exe.is_file() {
        eprintln!("SKIP cli test: {} not found", exe.display());
        return;
    }
    let dir = scratch("cli");
    let data = write_data(&dir.0);
    let out = dir.0.join("r.jsonl");
    let model = tiny_model();
    let run = |args: &[&str]| {
        let o = std::process::Command::new(&exe)
            .arg("eval-mc")
            .args(["--model", model.to_str().unwrap(), "--data", data.to_str().unwrap()])
            .args(args)
            .output()
            .unwrap();
        (
            o.status.success(),
            format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
        )
    };
    let (ok, text) = run(&["--max-tokens", "4", "--batch", "3", "--out", out.to_str().unwrap()]);
    assert!(ok, "{text}");
    assert!(
        text.contains("accuracy") && text.contains("95% CI") && text.contains("Wilson"),
        "{text}"
    );
    assert!(text.contains("extraction: ") && text.contains("results: "), "{text}");
    let first = check_results_file(&out, 6);
    let truncated = first.iter().filter(|r| r.truncated).count();

    let out2 = dir.0.join("r2.jsonl");
    let (ok, text) = run(&[
        "--max-tokens",
        "8",
        "--rerun-truncated",
        out.to_str().unwrap(),
        "--out",
        out2.to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    assert!(text.contains(&format!("reran {truncated} truncated")), "{text}");
    let second = check_results_file(&out2, 6);
    for (a, b) in first.iter().zip(&second) {
        assert_eq!(a.key(), b.key());
        assert_eq!(b.max_tokens, if a.truncated { 8 } else { 4 });
    }
    // Same budget again: refused with the item named (when something was truncated).
    if truncated > 0 {
        let (ok, text) = run(&["--max-tokens", "4", "--rerun-truncated", out.to_str().unwrap()]);
        assert!(!ok && text.contains("must be larger"), "{text}");
    }

    // A bad data line: an error naming the line and the field, no panic.
    let bad = dir.0.join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"question\": \"Q\", \"options\": [\"a\",\"b\",\"c\",\"d\"], \"answer\": \"A\"}\n\
         {\"question\": \"Q\", \"options\": [\"a\",\"b\"], \"answer\": \"A\"}\n",
    )
    .unwrap();
    let o = std::process::Command::new(&exe)
        .args(["eval-mc", "--model", model.to_str().unwrap(), "--data", bad.to_str().unwrap()])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("line 2") && err.contains("`options`"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Runs the `deltakit` binary with `args`; `None` if it is not built.
fn deltakit(args: &[&str]) -> Option<(bool, String)> {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_deltakit"));
    if !exe.is_file() {
        eprintln!("SKIP cli test: {} not found", exe.display());
        return None;
    }
    let o =
        std::process::Command::new(&exe).args(args).env("RUST_BACKTRACE", "0").output().unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(!text.contains("panicked"), "{text}");
    Some((o.status.success(), text))
}

/// Review findings 9, 10, 11, 12, 14: output safety and rerun checks of `eval-mc`.
#[test]
#[allow(clippy::too_many_lines)]
fn cli_eval_mc_protects_files_and_checks_reruns() {
    let dir = scratch("safety");
    let data = write_data(&dir.0);
    let model = tiny_model();
    let (m, d) = (model.to_str().unwrap(), data.to_str().unwrap());
    let data_before = std::fs::read_to_string(&data).unwrap();

    // 10: --out equal to --data (also through another spelling of the path) is refused.
    let alias = dir.0.join(".").join("mc.jsonl");
    let Some((ok, text)) =
        deltakit(&["eval-mc", "--model", m, "--data", d, "--out", alias.to_str().unwrap()])
    else {
        return;
    };
    assert!(!ok && text.contains("is the --data file"), "{text}");
    assert_eq!(std::fs::read_to_string(&data).unwrap(), data_before);

    // 9: a run that fails (a prompt longer than the model's context) leaves --out untouched.
    let out = dir.0.join("keep.jsonl");
    std::fs::write(&out, "previous results\n").unwrap();
    let long = dir.0.join("long.jsonl");
    let q = "word ".repeat(6000);
    let line = serde_json::json!({"question": q, "options": ["a", "b", "c", "d"], "answer": "A"});
    std::fs::write(&long, format!("{line}\n")).unwrap();
    let (ok, text) = deltakit(&[
        "eval-mc",
        "--model",
        m,
        "--data",
        long.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ])
    .unwrap();
    assert!(!ok && text.contains("leaves no room"), "{text}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "previous results\n");
    assert!(!dir.0.join("keep.jsonl.partial").exists(), "an empty partial file is removed");

    // 14: a huge --max-tokens does not overflow (the context caps generation).
    let r1 = dir.0.join("r1.jsonl");
    let (ok, text) = deltakit(&[
        "eval-mc",
        "--model",
        m,
        "--data",
        d,
        "--limit",
        "1",
        "--max-tokens",
        "18446744073709551615",
        "--out",
        r1.to_str().unwrap(),
    ])
    .unwrap();
    assert!(ok, "{text}");
    assert!(!dir.0.join("r1.jsonl.partial").exists(), "renamed over --out");
    let r = check_results_file(&r1, 1);
    assert!(!r[0].truncated || r[0].truncated_by.as_deref() == Some("context"), "{r:?}");

    // 12: an empty results file is an error.
    let empty = dir.0.join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let (ok, text) = deltakit(&[
        "eval-mc",
        "--model",
        m,
        "--data",
        d,
        "--max-tokens",
        "8",
        "--rerun-truncated",
        empty.to_str().unwrap(),
    ])
    .unwrap();
    assert!(!ok && text.contains("no results"), "{text}");

    // 11: results of another data file with the same default ids and gold letters are refused.
    let other = dir.0.join("other.jsonl");
    let results = dir.0.join("other-results.jsonl");
    let item = |q: &str| {
        serde_json::json!({"question": q, "options": ["w", "x", "y", "z"], "answer": "A"})
            .to_string()
    };
    std::fs::write(&other, format!("{}\n{}\n", item("first?"), item("second?"))).unwrap();
    let (ok, text) = deltakit(&[
        "eval-mc",
        "--model",
        m,
        "--data",
        other.to_str().unwrap(),
        "--max-tokens",
        "2",
        "--out",
        results.to_str().unwrap(),
    ])
    .unwrap();
    assert!(ok, "{text}");
    let changed = dir.0.join("changed.jsonl");
    std::fs::write(&changed, format!("{}\n{}\n", item("other first?"), item("other second?")))
        .unwrap();
    let (ok, text) = deltakit(&[
        "eval-mc",
        "--model",
        m,
        "--data",
        changed.to_str().unwrap(),
        "--max-tokens",
        "4",
        "--rerun-truncated",
        results.to_str().unwrap(),
    ])
    .unwrap();
    assert!(!ok && text.contains("fingerprint"), "{text}");

    // 16: a data line that is not UTF-8 is named.
    let latin1 = dir.0.join("latin1.jsonl");
    let mut bytes = format!("{}\n", item("first?")).into_bytes();
    bytes.extend_from_slice(b"{\"question\": \"caf\xe9\"}\n");
    std::fs::write(&latin1, bytes).unwrap();
    let (ok, text) =
        deltakit(&["eval-mc", "--model", m, "--data", latin1.to_str().unwrap()]).unwrap();
    assert!(!ok && text.contains("line 2") && text.contains("UTF-8"), "{text}");
}

/// Review finding 18: `generate` rejects bad sampling arguments and token lists.
#[test]
fn cli_generate_rejects_bad_arguments() {
    let model = tiny_model();
    let m = model.to_str().unwrap();
    for (args, want) in [
        (&["--temperature", "-1"][..], "temperature"),
        (&["--temperature", "NaN"][..], "temperature"),
        (&["--temperature", "inf"][..], "temperature"),
        (&["--top-p", "0"][..], "top_p"),
        (&["--top-p", "1.5"][..], "top_p"),
        (&["--top-p", "-0.5"][..], "top_p"),
        (&["--top-p", "NaN"][..], "top_p"),
        (&["--max-tokens", "0"][..], "--max-tokens must be > 0"),
        (&["--stop-token-ids", "99999"][..], "outside the vocabulary"),
        (&["--stop-token-ids=-5"][..], "--stop-token-ids"),
        (&["--page-size", "0"][..], "--page-size"),
        (&["--page-size", "100000000"][..], "1..=4096"),
        (&["--page-size", "18446744073709551615"][..], "--page-size"),
        (&["--prefill-chunk", "0"][..], "--prefill-chunk"),
    ] {
        let mut all = vec!["generate", "--model", m, "--token-ids", "1,2"];
        all.extend_from_slice(args);
        let Some((ok, text)) = deltakit(&all) else { return };
        assert!(!ok && text.contains(want), "{args:?}: {text}");
    }
    let (ok, text) = deltakit(&["generate", "--model", m, "--token-ids", "1,,2"]).unwrap();
    assert!(!ok && text.contains("empty token id"), "{text}");
    let (ok, text) = deltakit(&["generate", "--model", m, "--token-ids", "1,x"]).unwrap();
    assert!(!ok && text.contains("--token-ids") && text.contains("\"x\""), "{text}");
    // Review of stop 21: eval-mc counts are refused by the parser, like bench's.
    for flag in ["--batch", "--max-tokens", "--limit"] {
        let (ok, text) =
            deltakit(&["eval-mc", "--model", m, "--data", "/dev/null", flag, "0"]).unwrap();
        assert!(!ok && text.contains(flag) && text.contains(">= 1"), "{flag}: {text}");
    }
    // A world size the model cannot be split over is refused once by the launcher, before any
    // rank process starts (tiny-trained has 8 linear value heads).
    let (ok, text) =
        deltakit(&["generate", "--model", m, "--token-ids", "1,2", "--nproc-per-node", "3"])
            .unwrap();
    assert!(!ok && text.matches("not divisible by tp = 3").count() == 1, "{text}");
    for flag in ["--batch", "--prompt-len", "--gen-len"] {
        let args = ["bench", "--config", m, "--load-format", "dummy", flag, "0"];
        let (ok, text) = deltakit(&args).unwrap();
        assert!(!ok && text.contains(flag) && text.contains(">= 1"), "{flag}: {text}");
    }
    // Fresh-user review (stop 10): huge sizes are refused with an error, never an abort.
    let bench = |extra: &[&str]| {
        let mut all = vec!["bench", "--config", m, "--load-format", "dummy"];
        all.extend_from_slice(extra);
        deltakit(&all).unwrap()
    };
    let (ok, text) = bench(&["--batch", "100000000", "--prompt-len", "4", "--gen-len", "2"]);
    assert!(!ok && text.contains("KV / GDN state") && text.contains("--batch"), "{text}");
    let max = u64::MAX.to_string();
    for args in [
        ["--prompt-len", max.as_str(), "--gen-len", "2"],
        ["--prompt-len", "4", "--gen-len", max.as_str()],
    ] {
        let (ok, text) = bench(&args);
        assert!(!ok && text.contains("max_position_embeddings"), "{args:?}: {text}");
    }
    // A prompt longer than the context fails before anything is printed.
    let ids = vec!["5"; 5000].join(",");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_deltakit"))
        .args(["generate", "--model", m, "--token-ids", &ids, "--max-tokens", "2"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && out.stdout.is_empty(), "stdout: {:?}", out.stdout.len());
    assert!(err.contains("exceed the maximum context"), "{err}");
}
