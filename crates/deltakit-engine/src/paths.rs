//! Locating the bundled tiny model and the test fixtures at run time.
//!
//! Data paths are resolved when the program runs (never baked in at compile time), so a binary
//! or test copied elsewhere (e.g. the GPU bundle, which runs engine tests from a copy of the
//! package directory) still finds `tests/fixtures` by walking up from where it runs.

use std::path::{Path, PathBuf};

/// The bundled model used by `generate` (and `eval-mc`) when no `--model` is given: a 3.6 M
/// parameter Qwen3.5 (`Qwen3_5ForCausalLM`, 3 Gated DeltaNet : 1 gated attention layers, bf16)
/// trained on the Python 3.11 documentation by `tools/train_tiny.py` (corpus and tokenizer:
/// `tools/make_corpus.py`), so its text is readable; also a golden fixture with HF goldens.
pub const BUNDLED_MODEL: &str = "tiny-trained";

/// Environment variable overriding the bundled model directory.
pub const MODEL_DIR_ENV: &str = "DELTAKIT_MODEL_DIR";

fn walk_up(start: &Path) -> Option<PathBuf> {
    start.ancestors().map(|d| d.join("tests").join("fixtures")).find(|p| p.is_dir())
}

/// Find a `tests/fixtures` directory in the cwd or one of its parents, then in the directory of
/// the running executable or one of its parents.
#[must_use]
pub fn find_fixtures_dir() -> Option<PathBuf> {
    let cwd = std::env::current_dir().ok();
    let exe_dir = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf));
    cwd.as_deref().and_then(walk_up).or_else(|| exe_dir.as_deref().and_then(walk_up))
}

/// Resolve the bundled tiny Qwen3.5 model: `$DELTAKIT_MODEL_DIR` (when set and not empty), else
/// `tests/fixtures/tiny-trained` ([`BUNDLED_MODEL`]) found by walking up from the cwd, then from
/// the executable.
///
/// # Errors
/// [`crate::EngineError::Request`] saying where it looked, if no candidate has a `config.json`.
pub fn bundled_model_dir() -> crate::Result<PathBuf> {
    // An empty value counts as unset (`DELTAKIT_MODEL_DIR= deltakit ...`).
    if let Some(d) = std::env::var_os(MODEL_DIR_ENV).filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d);
        if d.join("config.json").is_file() {
            return Ok(d);
        }
        return Err(crate::EngineError::Request(format!(
            "{MODEL_DIR_ENV}={} has no config.json",
            d.display()
        )));
    }
    if let Some(d) = find_fixtures_dir().map(|f| f.join(BUNDLED_MODEL)) {
        if d.join("config.json").is_file() {
            return Ok(d);
        }
    }
    Err(crate::EngineError::Request(format!(
        "no --model given and the bundled model tests/fixtures/{BUNDLED_MODEL} was not found \
         above the current directory or the executable (set {MODEL_DIR_ENV} or pass --model DIR)"
    )))
}
