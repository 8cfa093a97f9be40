//! Per-item results (JSONL) and the accuracy summary with a Wilson score interval.
//!
//! Each results line is one [`ItemResult`]:
//!
//! ```json
//! {"id":"q17","completion":" B","extracted":"B","gold":"B","correct":true,"truncated":false,
//!  "truncated_by":null,"item_hash":"5c0f3e0a9d1b2c47","max_tokens":64,"completion_tokens":2,
//!  "method":"standalone"}
//! ```
//!
//! `extracted` is a letter or the string `"unanswered"`; `truncated_by` is `"max_tokens"` (the
//! budget) or `"context"` (the engine's context) for a truncated item, else `null`; `item_hash`
//! is the item's fingerprint ([`McItem::fingerprint`](super::McItem::fingerprint): question and
//! options), checked by `--rerun-truncated`; `max_tokens` is the budget the item was generated
//! with (`--rerun-truncated` needs a larger one). Results files are validated when read (see
//! [`parse_results`]).
//!
//! **Confidence interval.** Accuracy `p = correct / n` is reported with the 95% Wilson score
//! interval (z = 1.959964): with `z2 = z^2`,
//! `center = (p + z2 / 2n) / (1 + z2 / n)` and
//! `half = z / (1 + z2 / n) * sqrt(p (1 - p) / n + z2 / 4n^2)`; the interval is
//! `[center - half, center + half]`. Unlike the normal approximation it stays inside `[0, 1]` and
//! is sensible at `p = 0`, `p = 1` and small `n`. Unanswered items count as incorrect.

use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::data::id_key;
use super::EvalError;

/// The `extracted` value of an item with no answer found.
pub const UNANSWERED: &str = "unanswered";

/// `truncated_by` of an item that hit its token budget.
pub const TRUNCATED_BY_MAX_TOKENS: &str = "max_tokens";

/// `truncated_by` of an item that hit the engine's context limit.
pub const TRUNCATED_BY_CONTEXT: &str = "context";

/// z of a two-sided 95% interval.
pub const Z95: f64 = 1.959_963_984_540_054;

/// One evaluated item: a line of the results file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ItemResult {
    /// The item id (string or number, as in the data).
    pub id: Value,
    /// The decoded completion (cut at the template's stop text, if any).
    pub completion: String,
    /// The extracted letter, or [`UNANSWERED`].
    pub extracted: String,
    /// The gold letter.
    pub gold: String,
    /// `extracted == gold`.
    pub correct: bool,
    /// Generation hit the token budget (or the context limit) before finishing.
    pub truncated: bool,
    /// Why it was truncated: [`TRUNCATED_BY_MAX_TOKENS`] or [`TRUNCATED_BY_CONTEXT`]; `None` if
    /// not truncated.
    pub truncated_by: Option<String>,
    /// The item's fingerprint (question and options), to tie the result to its data file.
    pub item_hash: String,
    /// The token budget this completion was generated with.
    pub max_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Which extraction rule decided (`marker`, `bold`, `standalone`, `option_text`, `none`,
    /// `invalid_letter`, `unfinished_reasoning`).
    pub method: String,
}

impl ItemResult {
    /// The id as a string key.
    #[must_use]
    pub fn key(&self) -> String {
        id_key(&self.id)
    }

    /// No answer was extracted.
    #[must_use]
    pub fn unanswered(&self) -> bool {
        self.extracted == UNANSWERED
    }
}

/// Accuracy summary of a results set.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Items.
    pub n: usize,
    /// Correct items.
    pub correct: usize,
    /// Items with no extracted answer (scored incorrect).
    pub unanswered: usize,
    /// Items whose generation hit the token budget.
    pub truncated: usize,
    /// `correct / n` (0 for `n = 0`).
    pub accuracy: f64,
    /// 95% Wilson score interval of the accuracy.
    pub ci95: (f64, f64),
}

impl Summary {
    /// Summarize `results`.
    #[must_use]
    pub fn of(results: &[ItemResult]) -> Self {
        let n = results.len();
        let correct = results.iter().filter(|r| r.correct).count();
        let unanswered = results.iter().filter(|r| r.unanswered()).count();
        let truncated = results.iter().filter(|r| r.truncated).count();
        let accuracy = if n == 0 { 0.0 } else { correct as f64 / n as f64 };
        Self { n, correct, unanswered, truncated, accuracy, ci95: wilson(correct, n, Z95) }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "accuracy {:.2}% ({}/{}), 95% CI [{:.2}%, {:.2}%] (Wilson) | unanswered {} | \
             truncated {}",
            self.accuracy * 100.0,
            self.correct,
            self.n,
            self.ci95.0 * 100.0,
            self.ci95.1 * 100.0,
            self.unanswered,
            self.truncated
        )
    }
}

/// How many results each extraction method decided, most frequent first (ties by name):
/// `marker 41, standalone 3, none 2`.
#[must_use]
pub fn method_counts(results: &[ItemResult]) -> Vec<(String, usize)> {
    let mut m: HashMap<&str, usize> = HashMap::new();
    for r in results {
        *m.entry(r.method.as_str()).or_default() += 1;
    }
    let mut v: Vec<(String, usize)> = m.into_iter().map(|(k, n)| (k.to_string(), n)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

/// Wilson score interval of `successes` out of `n` trials at normal quantile `z`; `(0, 1)` for
/// `n = 0`. Bounds are clamped to `[0, 1]` (rounding).
#[must_use]
pub fn wilson(successes: usize, n: usize, z: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let nf = n as f64;
    let p = successes.min(n) as f64 / nf;
    let z2 = z * z;
    let denom = 1.0 + z2 / nf;
    let center = (p + z2 / (2.0 * nf)) / denom;
    let half = z / denom * (p * (1.0 - p) / nf + z2 / (4.0 * nf * nf)).sqrt();
    ((center - half).max(0.0), (center + half).min(1.0))
}

/// Whether `s` is one letter `A..=J`.
fn is_letter(s: &str) -> bool {
    let mut c = s.chars();
    matches!((c.next(), c.next()), (Some('A'..='J'), None))
}

/// Check one result's internal consistency.
fn validate(r: &ItemResult) -> Result<(), String> {
    if !is_letter(&r.gold) {
        return Err(format!("gold {:?} is not a letter A..J", r.gold));
    }
    if r.extracted != UNANSWERED && !is_letter(&r.extracted) {
        return Err(format!("extracted {:?} is not a letter A..J or {UNANSWERED:?}", r.extracted));
    }
    if r.correct != (r.extracted == r.gold) {
        return Err(format!(
            "correct is {} but extracted {:?} and gold {:?}",
            r.correct, r.extracted, r.gold
        ));
    }
    if r.max_tokens == 0 {
        return Err("max_tokens must be >= 1".into());
    }
    if r.completion_tokens > r.max_tokens {
        return Err(format!(
            "completion_tokens {} exceeds max_tokens {}",
            r.completion_tokens, r.max_tokens
        ));
    }
    match (r.truncated, r.truncated_by.as_deref()) {
        (false, None) | (true, Some(TRUNCATED_BY_MAX_TOKENS | TRUNCATED_BY_CONTEXT)) => {}
        (t, by) => {
            return Err(format!(
                "truncated {t} with truncated_by {by:?} (expected null, \"max_tokens\" or \
                 \"context\", set exactly when truncated)"
            ))
        }
    }
    if r.item_hash.len() != 16 || !r.item_hash.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!("item_hash {:?} is not 16 hex digits", r.item_hash));
    }
    Ok(())
}

/// Parse a results JSONL text (blank lines skipped). Each line is validated: `gold` a letter
/// `A..=J`, `extracted` one too or `"unanswered"`, `correct == (extracted == gold)`,
/// `1 <= max_tokens`, `completion_tokens <= max_tokens`, `truncated_by` set exactly when
/// `truncated`, `item_hash` 16 hex digits. (Whether a letter exists for the item is checked
/// against the data file by [`select_truncated`](super::select_truncated).)
///
/// # Errors
/// [`EvalError::Results`] naming the line for malformed or inconsistent lines or duplicate ids.
pub fn parse_results(text: &str) -> Result<Vec<ItemResult>, EvalError> {
    let mut out = Vec::new();
    let mut seen = HashMap::new();
    for (i, l) in text.lines().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        let bad = |msg: String| EvalError::Results { file: None, line: i + 1, msg };
        let r: ItemResult = serde_json::from_str(l).map_err(|e| bad(e.to_string()))?;
        validate(&r).map_err(bad)?;
        if let Some(prev) = seen.insert(r.key(), i + 1) {
            return Err(EvalError::Results {
                file: None,
                line: i + 1,
                msg: format!("duplicate id {} (first on line {prev})", r.key()),
            });
        }
        out.push(r);
    }
    Ok(out)
}

/// Read a results file.
///
/// # Errors
/// [`EvalError::Io`] if it cannot be read; as [`parse_results`] otherwise (path added).
pub fn read_results(path: &Path) -> Result<Vec<ItemResult>, EvalError> {
    let bytes =
        std::fs::read(path).map_err(|source| EvalError::Io { path: path.to_path_buf(), source })?;
    let text = super::data::decode_text(&bytes).map_err(|e| match e {
        EvalError::Data { line, msg, .. } => EvalError::Results { file: None, line, msg },
        e => e,
    })?;
    parse_results(&text).map_err(|e| e.in_file(path))
}

/// One results line (JSON, no trailing newline).
///
/// # Errors
/// [`EvalError::Results`] if serialization fails (it does not for these types).
pub fn to_line(r: &ItemResult) -> Result<String, EvalError> {
    serde_json::to_string(r).map_err(|e| EvalError::Results {
        file: None,
        line: 0,
        msg: e.to_string(),
    })
}

/// Write `results` to `path` atomically (a sibling temporary file renamed over it), so `path`
/// may be the file the results were read from.
///
/// # Errors
/// [`EvalError::Io`] on write or rename failures.
pub fn write_results(path: &Path, results: &[ItemResult]) -> Result<(), EvalError> {
    let io = |source| EvalError::Io { path: path.to_path_buf(), source };
    let mut name = path.file_name().map(std::ffi::OsStr::to_os_string).unwrap_or_default();
    name.push(".tmp");
    let tmp = path.with_file_name(name);
    let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
    for r in results {
        writeln!(f, "{}", to_line(r)?).map_err(io)?;
    }
    f.into_inner().map_err(|e| io(e.into_error()))?.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: (f64, f64), b: (f64, f64)) -> bool {
        (a.0 - b.0).abs() < 5e-5 && (a.1 - b.1).abs() < 5e-5
    }

    #[test]
    fn wilson_hand_checked() {
        // 5/10: p = 0.5, z2/n = 0.38415, center 0.5, half = 1.96/1.38415 * sqrt(0.025 + 0.0096)
        // = 0.26340.
        assert!(close(wilson(5, 10, Z95), (0.236_60, 0.763_40)), "{:?}", wilson(5, 10, Z95));
        // 0/10: center = half = 0.19207 / 1.38415 = 0.13876 -> [0, 0.27753].
        assert!(close(wilson(0, 10, Z95), (0.0, 0.277_53)), "{:?}", wilson(0, 10, Z95));
        // 10/10 mirrors 0/10.
        assert!(close(wilson(10, 10, Z95), (0.722_47, 1.0)), "{:?}", wilson(10, 10, Z95));
        // 81/263 (p = 0.30798): [0.25529, 0.36621].
        assert!(close(wilson(81, 263, Z95), (0.255_29, 0.366_21)), "{:?}", wilson(81, 263, Z95));
        // 1/6: [0.03005, 0.56350].
        assert!(close(wilson(1, 6, Z95), (0.030_05, 0.563_50)), "{:?}", wilson(1, 6, Z95));
        assert_eq!(wilson(0, 0, Z95), (0.0, 1.0));
    }

    fn res(id: i64, extracted: &str, gold: &str, truncated: bool) -> ItemResult {
        ItemResult {
            id: id.into(),
            completion: String::new(),
            extracted: extracted.into(),
            gold: gold.into(),
            correct: extracted == gold,
            truncated,
            truncated_by: truncated.then(|| TRUNCATED_BY_MAX_TOKENS.to_string()),
            item_hash: "0123456789abcdef".into(),
            max_tokens: 8,
            completion_tokens: 8,
            method: "marker".into(),
        }
    }

    #[test]
    fn summary_counts() {
        let rs = vec![
            res(0, "A", "A", false),
            res(1, UNANSWERED, "B", true),
            res(2, "C", "D", false),
            res(3, "D", "D", true),
        ];
        let s = Summary::of(&rs);
        assert_eq!((s.n, s.correct, s.unanswered, s.truncated), (4, 2, 1, 2));
        assert!((s.accuracy - 0.5).abs() < 1e-12);
        assert!(s.to_string().contains("accuracy 50.00% (2/4)"), "{s}");
        let mut rs = rs;
        rs[1].method = "none".into();
        assert_eq!(method_counts(&rs), vec![("marker".to_string(), 3), ("none".to_string(), 1)]);
    }

    #[test]
    fn results_round_trip_and_errors() {
        let rs = vec![res(0, "A", "A", false), res(1, UNANSWERED, "B", true)];
        let text: String = rs.iter().map(|r| to_line(r).unwrap() + "\n").collect();
        assert_eq!(parse_results(&text).unwrap(), rs);
        let e = parse_results("{\"id\": 1}\n").unwrap_err().to_string();
        assert!(e.contains("line 1"), "{e}");
        let dup = format!("{}\n{}\n", to_line(&rs[0]).unwrap(), to_line(&rs[0]).unwrap());
        let e = parse_results(&dup).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("duplicate id 0"), "{e}");
    }

    /// Review finding 13: results files are validated, not trusted.
    #[test]
    fn results_are_validated() {
        let ok = res(0, "A", "A", false);
        let check = |f: &dyn Fn(&mut ItemResult), want: &str| {
            let mut r = ok.clone();
            f(&mut r);
            let e = parse_results(&to_line(&r).unwrap()).unwrap_err().to_string();
            assert!(e.contains("line 1") && e.contains(want), "{want}: {e}");
        };
        check(
            &|r| {
                r.extracted = "banana".into();
                r.correct = true;
            },
            "extracted \"banana\"",
        );
        check(&|r| r.correct = false, "correct is false");
        check(&|r| r.max_tokens = 0, "max_tokens must be >= 1");
        check(&|r| r.completion_tokens = 9, "exceeds max_tokens");
        check(&|r| r.gold = "K".into(), "gold \"K\"");
        check(&|r| r.truncated = true, "truncated true");
        check(&|r| r.truncated_by = Some("banana".into()), "truncated false");
        check(&|r| r.item_hash = "xyz".into(), "item_hash");
        assert!(parse_results(&to_line(&ok).unwrap()).is_ok());
    }
}
