//! The README's `eval-mc` example end to end on a fresh clone: `deltakit eval-mc --data
//! examples/items.jsonl` run from the repository root with no `--model` (so on the bundled
//! trained model, `tests/fixtures/tiny-trained`), on the CPU. The score is not the point: the
//! run must succeed, print the accuracy line and write one well-formed result per item.
//! Skipped where the binary or the items file is not at its in-tree path (the GPU bundle).

use std::path::PathBuf;

#[test]
fn readme_eval_mc_example_runs_on_the_bundled_model() {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_deltakit"));
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let items = root.join("examples/items.jsonl");
    if !exe.is_file() || !items.is_file() {
        eprintln!("SKIP eval-mc sample: {} or {} not found", exe.display(), items.display());
        return;
    }
    let n_items =
        std::fs::read_to_string(&items).unwrap().lines().filter(|l| !l.is_empty()).count();
    assert!(n_items >= 4, "examples/items.jsonl has {n_items} items");
    let out_dir = std::env::temp_dir().join(format!("deltakit-eval-sample-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let results = out_dir.join("results.jsonl");
    let o = std::process::Command::new(&exe)
        .args(["eval-mc", "--data", "examples/items.jsonl", "--max-tokens", "16", "--out"])
        .arg(&results)
        .current_dir(&root)
        // Empty counts as unset (review of stop 21: it was taken as the path "").
        .env("DELTAKIT_MODEL_DIR", "")
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{text}");
    assert!(text.contains("accuracy") && text.contains("95% CI"), "{text}");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&results)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let _ = std::fs::remove_dir_all(&out_dir);
    assert_eq!(lines.len(), n_items, "{text}");
    for v in &lines {
        let ex = v["extracted"].as_str().unwrap();
        assert!(ex == "unanswered" || ("A"..="D").contains(&ex), "{v}");
        assert_eq!(v["correct"].as_bool().unwrap(), ex == v["gold"].as_str().unwrap(), "{v}");
        assert!(v["completion_tokens"].as_u64().unwrap() <= 16, "{v}");
    }
    eprintln!("{text}");
}
