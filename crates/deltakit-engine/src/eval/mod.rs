//! Multiple-choice knowledge evaluation (MMLU-Redux / SuperGPQA style) through the engine.
//!
//! - [`data`]: the JSONL item format and its validation;
//! - [`mod@extract`]: answer extraction from a completion (markers, standalone letter, option text;
//!   never a guess);
//! - [`report`]: per-item results (JSONL), accuracy with a 95% Wilson score interval.
//!
//! This module ties them together: prompts from a [`Template`], batched greedy generation with
//! [`Engine::generate`], scoring, and the `--rerun-truncated` merge.
//!
//! # Prompt template (zero-shot)
//!
//! [`Template::Plain`] (default; works for base and instruction models alike):
//!
//! ```text
//! The following is a multiple-choice question. Choose the single best option.
//!
//! Question: {question}
//! A. {option A}
//! B. {option B}
//! ...
//!
//! Reply with the letter of the correct option (A, B, C or D).
//! Answer:
//! ```
//!
//! The letter list names the item's letters (`A, B, C, D, E or F` for six options). Question and
//! options are inserted verbatim (trimmed). The completion is cut where a base model starts
//! another item: at the first line (after the first) that starts, case-insensitively and after
//! optional spaces and `#` heading marks, with `Question:` / `Question 2:` / `Question :`, `Q:` /
//! `Q2:`, `The following is a multiple-choice question` or MMLU's `The following are multiple
//! choice questions`. A completion cut there is not truncated. (ChatML completions are not cut
//! here, their turn ends with `<|im_end|>`; but [`extract::extract`] itself reads only the text
//! before such a line, whatever the template, so a next item never decides the answer.)
//!
//! [`Template::Chatml`] wraps the same text, without the final `Answer:` line and with
//! `End your reply with "Answer: X", where X is the letter.` added, as one user turn in the
//! ChatML format of Qwen chat models (`<|im_start|>user ... <|im_end|>` then
//! `<|im_start|>assistant\n`); `<|im_end|>` is a stop token when the tokenizer has it.
//!
//! Generation is greedy (temperature 0) with the model's `eos_token_id` as stop tokens and a
//! per-item token budget; an item is *truncated* when it hit the budget (`truncated_by:
//! "max_tokens"`) or the engine's context limit (`"context"`) without a stop token or stop text.
//! `--rerun-truncated` reruns only budget truncations (a larger budget cannot help the others).

pub mod data;
pub mod extract;
pub mod report;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::error::EngineError;
use crate::generate::{Engine, Event, FinishReason, GenOptions, Request, SamplingParams};
use crate::tokenizer::Tokenizer;

pub use data::{load_jsonl, McItem};
pub use extract::{extract, Extraction, Method};
pub use report::{ItemResult, Summary, TRUNCATED_BY_CONTEXT, TRUNCATED_BY_MAX_TOKENS, UNANSWERED};

/// Errors of the evaluation tool.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EvalError {
    /// A data line is invalid.
    #[error("{}{}", file_prefix(file.as_deref()), data_msg(*line, field, msg))]
    Data {
        /// The data file, when known.
        file: Option<PathBuf>,
        /// 1-based line number (0: the file as a whole).
        line: usize,
        /// The offending field (`(line)` for the whole line).
        field: String,
        /// What is wrong.
        msg: String,
    },
    /// A results line is invalid.
    #[error("{}line {line}: {msg}", file_prefix(file.as_deref()))]
    Results {
        /// The results file, when known.
        file: Option<PathBuf>,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        msg: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}", path = path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Invalid options or inputs that do not fit together (e.g. a rerun budget that is not
    /// larger, results that do not belong to the data file).
    #[error("{0}")]
    Invalid(String),
    /// The engine failed (tokenizer, generation, ...).
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// `line N: field `F`: msg`, or just `msg` for the file as a whole (line 0).
fn data_msg(line: usize, field: &str, msg: &str) -> String {
    if line == 0 {
        msg.to_string()
    } else {
        format!("line {line}: field `{field}`: {msg}")
    }
}

fn file_prefix(file: Option<&Path>) -> String {
    file.map(|f| format!("{}: ", f.display())).unwrap_or_default()
}

impl EvalError {
    /// Attach the file name to a [`EvalError::Data`] / [`EvalError::Results`] error.
    #[must_use]
    pub fn in_file(self, path: &Path) -> Self {
        match self {
            EvalError::Data { line, field, msg, .. } => {
                EvalError::Data { file: Some(path.to_path_buf()), line, field, msg }
            }
            EvalError::Results { line, msg, .. } => {
                EvalError::Results { file: Some(path.to_path_buf()), line, msg }
            }
            e => e,
        }
    }
}

/// The prompt format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Template {
    /// Plain text ending in `Answer:` (see the module docs).
    #[default]
    Plain,
    /// The same question as one ChatML user turn (Qwen chat models).
    Chatml,
}

impl Template {
    /// Where a completion is cut (a base model starting the next item; see the module docs).
    #[must_use]
    pub fn cut_point(self, completion: &str) -> Option<usize> {
        match self {
            Template::Plain => extract::next_item_cut(completion),
            Template::Chatml => None,
        }
    }
}

/// `A, B, C or D` for `n = 4`.
fn letter_list(n: usize) -> String {
    let letters: Vec<String> = (0..n).map(|i| data::letter(i).to_string()).collect();
    match letters.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => letters.concat(),
    }
}

/// The prompt of `item` under `template` (see the module docs).
#[must_use]
pub fn format_prompt(item: &McItem, template: Template) -> String {
    let mut body = String::from(
        "The following is a multiple-choice question. Choose the single best option.\n\n",
    );
    let _ = writeln!(body, "Question: {}", item.question.trim());
    for (i, o) in item.options.iter().enumerate() {
        let _ = writeln!(body, "{}. {}", data::letter(i), o.trim());
    }
    let letters = letter_list(item.options.len());
    match template {
        Template::Plain => {
            let _ =
                write!(body, "\nReply with the letter of the correct option ({letters}).\nAnswer:");
            body
        }
        Template::Chatml => {
            let _ = write!(
                body,
                "\nReply with the letter of the correct option ({letters}). End your reply with \
                 \"Answer: X\", where X is the letter."
            );
            format!("<|im_start|>user\n{body}<|im_end|>\n<|im_start|>assistant\n")
        }
    }
}

/// Evaluation options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvalOptions {
    /// Token budget per item.
    pub max_tokens: usize,
    /// Sequences generated together (the engine should have at least this many state slots).
    pub batch: usize,
    /// Prompt format.
    pub template: Template,
    /// Stop tokens (the model's `eos_token_id`, plus `<|im_end|>` for ChatML).
    pub stop_tokens: Vec<u32>,
    /// Engine scheduler options.
    pub gen: GenOptions,
}

impl Default for EvalOptions {
    fn default() -> Self {
        Self {
            max_tokens: 64,
            batch: 8,
            template: Template::Plain,
            stop_tokens: Vec::new(),
            gen: GenOptions::default(),
        }
    }
}

/// Stop tokens for `template`: `eos` plus, for ChatML, `<|im_end|>` if the tokenizer has it.
#[must_use]
pub fn stop_tokens(tok: &Tokenizer, eos: &[u32], template: Template) -> Vec<u32> {
    let mut v = eos.to_vec();
    if template == Template::Chatml {
        if let Some(id) = tok.token_to_id("<|im_end|>") {
            if !v.contains(&id) {
                v.push(id);
            }
        }
    }
    v
}

/// Tokenize every item's prompt.
///
/// # Errors
/// [`EvalError::Engine`] (tokenizer) naming the item, or an empty prompt.
pub fn encode_prompts(
    tok: &Tokenizer,
    items: &[McItem],
    template: Template,
) -> Result<Vec<Vec<u32>>, EvalError> {
    items
        .iter()
        .map(|it| {
            let ids = tok.encode(&format_prompt(it, template)).map_err(|e| {
                EvalError::Invalid(format!("item {}: encoding the prompt: {e}", it.key()))
            })?;
            if ids.is_empty() {
                return Err(EvalError::Invalid(format!("item {}: empty prompt", it.key())));
            }
            Ok(ids)
        })
        .collect()
}

/// Score one completion: cut at the template's cut point, extract, compare with the gold.
/// `hit_limit`: why generation stopped without a stop token ([`TRUNCATED_BY_MAX_TOKENS`] or
/// [`TRUNCATED_BY_CONTEXT`]), `None` if it stopped.
#[must_use]
pub fn score(
    item: &McItem,
    text: &str,
    completion_tokens: usize,
    hit_limit: Option<&str>,
    max_tokens: usize,
    template: Template,
) -> ItemResult {
    let (completion, cut) = match template.cut_point(text) {
        Some(p) => (&text[..p], true),
        None => (text, false),
    };
    let ex = extract(completion, &item.options);
    let gold = item.gold_letter();
    ItemResult {
        id: item.id.clone(),
        completion: completion.to_string(),
        extracted: ex.letter().map_or_else(|| UNANSWERED.to_string(), |c| c.to_string()),
        gold: gold.to_string(),
        correct: ex.letter() == Some(gold),
        truncated: hit_limit.is_some() && !cut,
        truncated_by: hit_limit.filter(|_| !cut).map(str::to_string),
        item_hash: item.fingerprint(),
        max_tokens,
        completion_tokens,
        method: ex.method.as_str().to_string(),
    }
}

/// Callbacks of [`evaluate`]: progress and streaming of results.
pub trait Observer {
    /// One sequence finished generating.
    fn sequence_finished(&mut self) {}
    /// One item is scored (results arrive in item order, a chunk at a time).
    ///
    /// # Errors
    /// Any error stops the evaluation and is returned by [`evaluate`].
    fn item_done(&mut self, _result: &ItemResult) -> Result<(), EvalError> {
        Ok(())
    }
}

/// An observer that does nothing.
impl Observer for () {}

/// Requests handed to the engine per [`Engine::generate`] call, in multiples of the batch: the
/// scheduler admits waiting requests as sequences finish (continuous batching), and results are
/// streamed to the [`Observer`] after each call.
const CHUNK_BATCHES: usize = 4;

/// Generate and score `items` (with their `prompts` from [`encode_prompts`]).
///
/// # Errors
/// [`EvalError::Invalid`] for mismatched inputs, a zero budget/batch, or a prompt that fills the
/// engine's maximum context; engine errors; the observer's errors. (A prompt that fits but
/// leaves fewer than `max_tokens` tokens generates up to the context and is marked truncated.)
pub fn evaluate(
    engine: &mut Engine,
    tok: &Tokenizer,
    items: &[McItem],
    prompts: &[Vec<u32>],
    opts: &EvalOptions,
    obs: &mut dyn Observer,
) -> Result<Vec<ItemResult>, EvalError> {
    if items.len() != prompts.len() {
        return Err(EvalError::Invalid(format!(
            "{} items but {} prompts",
            items.len(),
            prompts.len()
        )));
    }
    if opts.max_tokens == 0 || opts.batch == 0 {
        return Err(EvalError::Invalid("max_tokens and batch must be > 0".into()));
    }
    let max_ctx = engine.cache_config().max_context;
    if items.is_empty() {
        return Ok(Vec::new());
    }
    for (it, p) in items.iter().zip(prompts) {
        if p.len() >= max_ctx {
            return Err(EvalError::Invalid(format!(
                "item {}: the prompt has {} tokens, which leaves no room to generate in the \
                 engine's context of {max_ctx} tokens",
                it.key(),
                p.len()
            )));
        }
    }
    let chunk = opts.batch.saturating_mul(CHUNK_BATCHES);
    let mut results = Vec::with_capacity(items.len());
    for (its, ps) in items.chunks(chunk).zip(prompts.chunks(chunk)) {
        let requests: Vec<Request> = ps
            .iter()
            .map(|p| Request {
                prompt: p.clone(),
                params: SamplingParams {
                    temperature: 0.0,
                    max_tokens: opts.max_tokens,
                    stop_tokens: opts.stop_tokens.clone(),
                    ..SamplingParams::default()
                },
            })
            .collect();
        let mut on_event = |ev: Event| {
            if matches!(ev, Event::Finished { .. }) {
                obs.sequence_finished();
            }
        };
        let (completions, _) = engine.generate(&requests, opts.gen, &mut on_event)?;
        for (item, c) in its.iter().zip(&completions) {
            let text = tok.decode(&c.tokens)?;
            let hit_limit = match c.reason {
                FinishReason::Stop => None,
                FinishReason::Context => Some(TRUNCATED_BY_CONTEXT),
                FinishReason::Length => Some(TRUNCATED_BY_MAX_TOKENS),
            };
            let r = score(item, &text, c.tokens.len(), hit_limit, opts.max_tokens, opts.template);
            obs.item_done(&r)?;
            results.push(r);
        }
    }
    Ok(results)
}

/// The items to regenerate for `--rerun-truncated`: those whose previous result was truncated
/// by the token budget (`truncated_by: "max_tokens"`; context truncations are kept: a larger
/// budget cannot help them). Every previous result must belong to `items` (same id, same item
/// fingerprint: question and options, same gold letter, an extracted letter the item has), there
/// must be at least one, and `max_tokens` must exceed each selected item's previous budget.
///
/// # Errors
/// [`EvalError::Invalid`] naming the offending id.
pub fn select_truncated(
    items: &[McItem],
    previous: &[ItemResult],
    max_tokens: usize,
) -> Result<Vec<McItem>, EvalError> {
    if previous.is_empty() {
        return Err(EvalError::Invalid("the results file has no results: nothing to rerun".into()));
    }
    let by_id: HashMap<String, &McItem> = items.iter().map(|it| (it.key(), it)).collect();
    let mut out = Vec::new();
    for r in previous {
        let item = by_id.get(&r.key()).ok_or_else(|| {
            EvalError::Invalid(format!("result id {} is not in the data file", r.key()))
        })?;
        if r.item_hash != item.fingerprint() {
            return Err(EvalError::Invalid(format!(
                "result id {}: item fingerprint {} but the data file's item has {} (question or \
                 options differ: results of another data file?)",
                r.key(),
                r.item_hash,
                item.fingerprint()
            )));
        }
        if !r.unanswered()
            && r.extracted
                .chars()
                .next()
                .and_then(data::letter_index)
                .is_none_or(|i| i >= item.options.len())
        {
            return Err(EvalError::Invalid(format!(
                "result id {}: extracted {:?} is not a letter of its {} options",
                r.key(),
                r.extracted,
                item.options.len()
            )));
        }
        if r.gold != item.gold_letter().to_string() {
            return Err(EvalError::Invalid(format!(
                "result id {}: gold {} but the data file says {}",
                r.key(),
                r.gold,
                item.gold_letter()
            )));
        }
        if r.truncated_by.as_deref() == Some(TRUNCATED_BY_MAX_TOKENS) {
            if max_tokens <= r.max_tokens {
                return Err(EvalError::Invalid(format!(
                    "result id {} was generated with max_tokens {}; --max-tokens {max_tokens} \
                     must be larger to rerun it",
                    r.key(),
                    r.max_tokens
                )));
            }
            out.push((*item).clone());
        }
    }
    Ok(out)
}

/// Replace the results in `previous` that have a counterpart (same id) in `fresh`; order and
/// all other results are kept.
#[must_use]
pub fn merge(previous: Vec<ItemResult>, fresh: Vec<ItemResult>) -> Vec<ItemResult> {
    let mut by_id: HashMap<String, ItemResult> = fresh.into_iter().map(|r| (r.key(), r)).collect();
    previous.into_iter().map(|r| by_id.remove(&r.key()).unwrap_or(r)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(n: usize) -> McItem {
        McItem {
            id: "q".into(),
            question: " What is 2+2? ".into(),
            options: (0..n).map(|i| format!("{}", i + 2)).collect(),
            answer: 2,
        }
    }

    #[test]
    fn prompt_template() {
        let p = format_prompt(&item(4), Template::Plain);
        assert!(p.contains("Question: What is 2+2?\nA. 2\nB. 3\nC. 4\nD. 5\n"), "{p}");
        assert!(p.ends_with("(A, B, C or D).\nAnswer:"), "{p}");
        let p = format_prompt(&item(10), Template::Chatml);
        assert!(p.starts_with("<|im_start|>user\n") && p.ends_with("<|im_start|>assistant\n"));
        assert!(p.contains("J. 11\n") && p.contains("(A, B, C, D, E, F, G, H, I or J)"), "{p}");
    }

    #[test]
    fn scoring_cuts_at_the_next_question() {
        let lim = Some(TRUNCATED_BY_MAX_TOKENS);
        let r = score(&item(4), " C\nQuestion: next? Answer: A", 9, lim, 9, Template::Plain);
        assert_eq!((r.extracted.as_str(), r.correct, r.truncated), ("C", true, false));
        assert_eq!(r.completion, " C");
        let r = score(
            &item(4),
            " D\n\nThe following is a multiple-choice question.",
            5,
            lim,
            5,
            Template::Plain,
        );
        assert_eq!(
            (r.extracted.as_str(), r.completion.as_str(), r.truncated),
            ("D", " D\n", false)
        );
        let r = score(&item(4), " hmm", 9, lim, 9, Template::Plain);
        assert_eq!((r.extracted.as_str(), r.correct, r.truncated), (UNANSWERED, false, true));
        assert_eq!(r.truncated_by.as_deref(), Some("max_tokens"));
    }

    /// Review finding 6: more ways a base model starts the next item.
    #[test]
    fn scoring_cuts_at_more_next_item_headers() {
        for next in [
            "\n\nQuestion 2: next?",
            "\n\nQ: next?",
            "\nquestion: next?",
            "\nQuestion : next?",
            "\n### Question: next?",
            "\n  ## question 3: next?",
            "\nThe following are multiple choice questions (with answers) about x.",
            "\nTHE FOLLOWING ARE MULTIPLE CHOICE QUESTIONS",
        ] {
            let text = format!(" C{next} Answer: A");
            let r = score(&item(4), &text, 9, Some(TRUNCATED_BY_MAX_TOKENS), 9, Template::Plain);
            assert_eq!((r.completion.trim_end(), r.extracted.as_str()), (" C", "C"), "{next:?}");
            assert!(!r.truncated && r.truncated_by.is_none(), "{next:?}");
        }
        // Not at a line start: not cut.
        let r = score(&item(4), " C, the question: is it?", 9, None, 9, Template::Plain);
        assert_eq!(r.completion, " C, the question: is it?");
        // Context truncation is recorded as such.
        let r = score(&item(4), " hmm", 9, Some(TRUNCATED_BY_CONTEXT), 9, Template::Plain);
        assert_eq!((r.truncated, r.truncated_by.as_deref()), (true, Some("context")));
    }

    #[test]
    fn rerun_selection_and_merge() {
        let items = vec![
            McItem { id: 0.into(), ..item(4) },
            McItem { id: 1.into(), ..item(4) },
            McItem { id: 2.into(), ..item(4) },
        ];
        let prev: Vec<ItemResult> = items
            .iter()
            .map(|it| {
                let trunc = (it.key() != "1").then_some(TRUNCATED_BY_MAX_TOKENS);
                score(it, "x", 8, trunc, 8, Template::Plain)
            })
            .collect();
        let sel = select_truncated(&items, &prev, 16).unwrap();
        assert_eq!(sel.iter().map(McItem::key).collect::<Vec<_>>(), ["0", "2"]);
        let e = select_truncated(&items, &prev, 8).unwrap_err().to_string();
        assert!(e.contains("must be larger"), "{e}");
        let e = select_truncated(&items[1..], &prev, 16).unwrap_err().to_string();
        assert!(e.contains("result id 0 is not in the data file"), "{e}");
        let fresh = vec![score(&sel[1], "C", 3, None, 16, Template::Plain)];
        let merged = merge(prev, fresh);
        assert_eq!(merged.len(), 3);
        assert_eq!(merged[2].max_tokens, 16);
        assert!(merged[2].correct && !merged[2].truncated);
        assert!(merged[0].truncated && merged[0].max_tokens == 8);
    }

    /// Review findings 11, 12, 13, 15: fingerprints, empty results, invalid letters, context
    /// truncations.
    #[test]
    fn rerun_checks_fingerprints_and_reasons() {
        let items = vec![McItem { id: 0.into(), ..item(4) }, McItem { id: 1.into(), ..item(4) }];
        let lim = Some(TRUNCATED_BY_MAX_TOKENS);
        let prev: Vec<ItemResult> =
            items.iter().map(|it| score(it, "x", 8, lim, 8, Template::Plain)).collect();
        // Same ids and gold letters, other questions: refused.
        let other: Vec<McItem> = items
            .iter()
            .map(|it| McItem { question: "Another question?".into(), ..it.clone() })
            .collect();
        let e = select_truncated(&other, &prev, 16).unwrap_err().to_string();
        assert!(e.contains("fingerprint") && e.contains("result id 0"), "{e}");
        let e = select_truncated(&items, &[], 16).unwrap_err().to_string();
        assert!(e.contains("no results"), "{e}");
        let mut bad = prev.clone();
        bad[1].extracted = "E".into();
        let e = select_truncated(&items, &bad, 16).unwrap_err().to_string();
        assert!(e.contains("result id 1") && e.contains("\"E\""), "{e}");
        // Context truncations are not rerun.
        let mut ctx = prev.clone();
        ctx[0] = score(&items[0], "x", 8, Some(TRUNCATED_BY_CONTEXT), 8, Template::Plain);
        let sel = select_truncated(&items, &ctx, 16).unwrap();
        assert_eq!(sel.iter().map(McItem::key).collect::<Vec<_>>(), ["1"]);
    }
}
