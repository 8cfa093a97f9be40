//! Multiple-choice data: one JSON object per line.
//!
//! ```json
//! {"id": "q17", "question": "Capital of France?", "options": ["Lyon", "Paris", "Nice", "Lille"], "answer": "B"}
//! {"question": "2 + 2 = ?", "options": ["3", "4", "5", "6"], "answer_index": 1}
//! ```
//!
//! - `id`: string or number, optional; default: the **0-based** index of the line in the file
//!   (blank lines count), so the item on line 1 (as error messages count, 1-based) has id `0`.
//!   Ids must be unique (results are merged by id).
//! - `question`: non-empty string.
//! - `options`: array of 4 to 10 non-empty, distinct strings (compared trimmed and
//!   case-insensitively); option `i` gets letter `A + i` (`A..=J`).
//! - `answer`: the gold letter (`"B"`, case-insensitive, surrounding whitespace and one pair of
//!   parentheses allowed: `"(b)"`), or `answer_index`: the 0-based gold index. At least one is
//!   required; if both are given they must agree.
//!
//! Other fields (subject, source, ...) are ignored. Blank lines are skipped; a leading UTF-8
//! byte-order mark is stripped. Every problem is reported as an [`EvalError::Data`] naming the
//! line (1-based) and the field (a line that is not UTF-8 included); a file without items says
//! so.

use std::collections::HashSet;
use std::path::Path;

use serde_json::Value;

use super::EvalError;

/// Fewest options of an item.
pub const MIN_OPTIONS: usize = 4;
/// Most options of an item (letters `A..=J`).
pub const MAX_OPTIONS: usize = 10;

/// One multiple-choice item.
#[derive(Clone, Debug, PartialEq)]
pub struct McItem {
    /// The item's id as given (string or number), or the line index.
    pub id: Value,
    /// The question text.
    pub question: String,
    /// Option texts; option `i` is letter `A + i`.
    pub options: Vec<String>,
    /// 0-based index of the gold option.
    pub answer: usize,
}

impl McItem {
    /// The id as a string key (strings as-is, numbers in decimal).
    #[must_use]
    pub fn key(&self) -> String {
        id_key(&self.id)
    }

    /// The gold letter.
    #[must_use]
    pub fn gold_letter(&self) -> char {
        letter(self.answer)
    }

    /// A fingerprint of the question and options: 16 hex digits of FNV-1a 64 over their JSON
    /// form (stable across runs and platforms). Stored in each result as `item_hash`.
    #[must_use]
    pub fn fingerprint(&self) -> String {
        let json = serde_json::json!([self.question, self.options]).to_string();
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in json.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{h:016x}")
    }
}

/// A string key of an id value: strings as-is, anything else in its JSON form.
#[must_use]
pub fn id_key(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// The letter of option `index` (`0 -> 'A'`); indices past `J` give `'?'`.
#[must_use]
pub fn letter(index: usize) -> char {
    if index < MAX_OPTIONS {
        char::from(b'A' + index as u8)
    } else {
        '?'
    }
}

/// The 0-based index of an option letter (`'A'`/`'a'` -> 0), if it is one of `A..=J`.
#[must_use]
pub fn letter_index(c: char) -> Option<usize> {
    let u = c.to_ascii_uppercase();
    if ('A'..='J').contains(&u) {
        Some(u as usize - 'A' as usize)
    } else {
        None
    }
}

fn bad(line: usize, field: &str, msg: impl Into<String>) -> EvalError {
    EvalError::Data { file: None, line, field: field.to_string(), msg: msg.into() }
}

/// Parse one data line. `index` is the 0-based line index (the default id); errors name line
/// `index + 1`.
///
/// # Errors
/// [`EvalError::Data`] naming the line and field.
pub fn parse_item(index: usize, text: &str) -> Result<McItem, EvalError> {
    let line = index + 1;
    let v: Value = serde_json::from_str(text)
        .map_err(|e| bad(line, "(line)", format!("not valid JSON: {e}")))?;
    let obj = v.as_object().ok_or_else(|| bad(line, "(line)", "expected a JSON object"))?;
    let id = match obj.get("id") {
        None | Some(Value::Null) => Value::from(index),
        Some(Value::String(s)) if s.trim().is_empty() => {
            return Err(bad(line, "id", "empty string"))
        }
        Some(v @ (Value::String(_) | Value::Number(_))) => v.clone(),
        Some(_) => return Err(bad(line, "id", "expected a string or a number")),
    };
    let question = match obj.get("question") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(Value::String(_)) => return Err(bad(line, "question", "empty string")),
        Some(_) => return Err(bad(line, "question", "expected a string")),
        None => return Err(bad(line, "question", "missing")),
    };
    let options = match obj.get("options") {
        Some(Value::Array(a)) => a,
        Some(_) => return Err(bad(line, "options", "expected an array of strings")),
        None => return Err(bad(line, "options", "missing")),
    };
    if !(MIN_OPTIONS..=MAX_OPTIONS).contains(&options.len()) {
        return Err(bad(
            line,
            "options",
            format!("{} options; expected {MIN_OPTIONS} to {MAX_OPTIONS}", options.len()),
        ));
    }
    let mut opts = Vec::with_capacity(options.len());
    for (i, o) in options.iter().enumerate() {
        match o {
            Value::String(s) if !s.trim().is_empty() => opts.push(s.clone()),
            Value::String(_) => {
                return Err(bad(line, "options", format!("option {} is empty", letter(i))))
            }
            _ => return Err(bad(line, "options", format!("option {} is not a string", letter(i)))),
        }
    }
    for (i, o) in opts.iter().enumerate() {
        let key = o.trim().to_lowercase();
        if let Some(j) = opts[..i].iter().position(|p| p.trim().to_lowercase() == key) {
            return Err(bad(
                line,
                "options",
                format!("options {} and {} are the same text {:?}", letter(j), letter(i), o.trim()),
            ));
        }
    }
    let n = opts.len();
    let from_letter = match obj.get("answer") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => {
            Some(parse_gold_letter(s, n).map_err(|m| bad(line, "answer", m))?)
        }
        Some(Value::Number(_)) => {
            return Err(bad(
                line,
                "answer",
                "a number; give the letter (\"B\") or the 0-based `answer_index`",
            ))
        }
        Some(_) => return Err(bad(line, "answer", "expected a letter string such as \"B\"")),
    };
    let from_index = match obj.get("answer_index") {
        None | Some(Value::Null) => None,
        Some(v) => {
            let i = v.as_u64().ok_or_else(|| {
                bad(line, "answer_index", "expected a non-negative integer (0-based)")
            })?;
            let i = usize::try_from(i).unwrap_or(usize::MAX);
            if i >= n {
                return Err(bad(
                    line,
                    "answer_index",
                    format!("{i} is out of range for {n} options (0-based)"),
                ));
            }
            Some(i)
        }
    };
    let answer = match (from_letter, from_index) {
        (Some(a), Some(b)) if a != b => {
            return Err(bad(
                line,
                "answer",
                format!("{} disagrees with answer_index {b} ({})", letter(a), letter(b)),
            ))
        }
        (Some(a), _) | (None, Some(a)) => a,
        (None, None) => return Err(bad(line, "answer", "missing (give answer or answer_index)")),
    };
    Ok(McItem { id, question, options: opts, answer })
}

/// A gold letter: one letter `A..=J` (any case, optional whitespace and parentheses) valid for
/// `n` options.
fn parse_gold_letter(s: &str, n: usize) -> Result<usize, String> {
    let t = s.trim();
    let t = t.strip_prefix('(').and_then(|x| x.strip_suffix(')')).unwrap_or(t).trim();
    let mut chars = t.chars();
    let (Some(c), None) = (chars.next(), chars.next()) else {
        return Err(format!("{s:?} is not a single letter"));
    };
    match letter_index(c) {
        Some(i) if i < n => Ok(i),
        _ => Err(format!("{s:?} is not a letter A..{} (the item has {n} options)", letter(n - 1))),
    }
}

/// Parse a whole JSONL text (blank lines skipped).
///
/// # Errors
/// [`EvalError::Data`] for the first bad line, a duplicate id, or no items at all.
pub fn parse_jsonl(text: &str) -> Result<Vec<McItem>, EvalError> {
    let mut items = Vec::new();
    let mut seen = HashSet::new();
    for (i, l) in text.lines().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        let item = parse_item(i, l)?;
        if !seen.insert(item.key()) {
            return Err(bad(i + 1, "id", format!("duplicate id {}", item.key())));
        }
        items.push(item);
    }
    if items.is_empty() {
        return Err(bad(0, "(file)", "no items (the file is empty or has only blank lines)"));
    }
    Ok(items)
}

/// Decode a JSONL file's bytes: a leading UTF-8 byte-order mark is stripped, and a line that is
/// not UTF-8 is an error naming it.
///
/// # Errors
/// [`EvalError::Data`] naming the first line that is not valid UTF-8.
pub fn decode_text(bytes: &[u8]) -> Result<String, EvalError> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok(s.to_string()),
        Err(e) => {
            let at = e.valid_up_to();
            let line = bytes[..at].split(|&b| b == b'\n').count();
            let col = at - bytes[..at].iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1);
            Err(bad(line, "(line)", format!("not valid UTF-8 (byte {} of the line)", col + 1)))
        }
    }
}

/// Read and parse a JSONL data file.
///
/// # Errors
/// [`EvalError::Io`] if it cannot be read; otherwise as [`decode_text`] and [`parse_jsonl`],
/// with the path added.
pub fn load_jsonl(path: &Path) -> Result<Vec<McItem>, EvalError> {
    let bytes =
        std::fs::read(path).map_err(|source| EvalError::Io { path: path.to_path_buf(), source })?;
    decode_text(&bytes).and_then(|t| parse_jsonl(&t)).map_err(|e| e.in_file(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(line: &str) -> String {
        parse_item(4, line).unwrap_err().to_string()
    }

    #[test]
    fn valid_items() {
        let it = parse_item(
            0,
            r#"{"id": "x1", "question": "Q?", "options": ["a","b","c","d"], "answer": "c"}"#,
        )
        .unwrap();
        assert_eq!((it.key(), it.answer, it.gold_letter()), ("x1".to_string(), 2, 'C'));
        let it = parse_item(
            7,
            r#"{"question": "Q?", "options": ["a","b","c","d","e"], "answer_index": 4, "subject": "x"}"#,
        )
        .unwrap();
        assert_eq!((it.key(), it.answer), ("7".to_string(), 4));
        let it = parse_item(
            0,
            r#"{"id": 12, "question": "Q", "options": ["1","2","3","4","5","6","7","8","9","10"], "answer": " (J) ", "answer_index": 9}"#,
        )
        .unwrap();
        assert_eq!((it.key(), it.gold_letter()), ("12".to_string(), 'J'));
    }

    #[test]
    fn invalid_items_name_line_and_field() {
        let e = err("{not json");
        assert!(e.contains("line 5") && e.contains("not valid JSON"), "{e}");
        let e = err(r#"{"options": ["a","b","c","d"], "answer": "A"}"#);
        assert!(e.contains("line 5") && e.contains("`question`") && e.contains("missing"), "{e}");
        let e = err(r#"{"question": "Q", "options": ["a","b","c"], "answer": "A"}"#);
        assert!(e.contains("`options`") && e.contains("3 options"), "{e}");
        let e = err(
            r#"{"question": "Q", "options": ["a","b","c","d","e","f","g","h","i","j","k"], "answer": "A"}"#,
        );
        assert!(e.contains("`options`") && e.contains("11 options"), "{e}");
        let e = err(r#"{"question": "Q", "options": ["a","b",3,"d"], "answer": "A"}"#);
        assert!(e.contains("`options`") && e.contains("option C is not a string"), "{e}");
        let e = err(r#"{"question": "Q", "options": ["a","b","c","d"], "answer": "E"}"#);
        assert!(e.contains("`answer`") && e.contains("A..D"), "{e}");
        let e = err(r#"{"question": "Q", "options": ["a","b","c","d"], "answer": "AB"}"#);
        assert!(e.contains("`answer`") && e.contains("single letter"), "{e}");
        let e = err(r#"{"question": "Q", "options": ["a","b","c","d"]}"#);
        assert!(e.contains("`answer`") && e.contains("missing"), "{e}");
        let e = err(r#"{"question": "Q", "options": ["a","b","c","d"], "answer_index": 4}"#);
        assert!(e.contains("`answer_index`") && e.contains("out of range"), "{e}");
        let e = err(r#"{"question": "Q", "options": ["a","b","c","d"], "answer_index": -1}"#);
        assert!(e.contains("`answer_index`"), "{e}");
        let e = err(
            r#"{"question": "Q", "options": ["a","b","c","d"], "answer": "A", "answer_index": 2}"#,
        );
        assert!(e.contains("disagrees"), "{e}");
        let e = err(r#"{"id": [1], "question": "Q", "options": ["a","b","c","d"], "answer": "A"}"#);
        assert!(e.contains("`id`"), "{e}");
        let e = err("[1, 2]");
        assert!(e.contains("JSON object"), "{e}");
    }

    #[test]
    fn files_skip_blank_lines_and_reject_duplicates() {
        let ok = "\n{\"question\": \"Q\", \"options\": [\"a\",\"b\",\"c\",\"d\"], \"answer\": \"A\"}\n\n";
        let items = parse_jsonl(ok).unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].key(), "1");
        let dup = "{\"id\": 1, \"question\": \"Q\", \"options\": [\"a\",\"b\",\"c\",\"d\"], \"answer\": \"A\"}\n\
                   {\"id\": \"1\", \"question\": \"Q\", \"options\": [\"a\",\"b\",\"c\",\"d\"], \"answer\": \"A\"}";
        let e = parse_jsonl(dup).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("duplicate id 1"), "{e}");
        let e = parse_jsonl("\n\n").unwrap_err().to_string();
        assert!(e.contains("no items") && !e.contains("line 0"), "{e}");
    }

    /// Review findings 16 and 17: BOM, non-UTF-8 lines, duplicate options, ids vs lines.
    #[test]
    fn encoding_and_duplicate_options() {
        let line =
            "{\"question\": \"Q\", \"options\": [\"a\",\"b\",\"c\",\"d\"], \"answer\": \"A\"}";
        let mut bom = b"\xEF\xBB\xBF".to_vec();
        bom.extend_from_slice(line.as_bytes());
        let items = parse_jsonl(&decode_text(&bom).unwrap()).unwrap();
        assert_eq!(items[0].key(), "0"); // the first line (line 1 in messages) has id 0
        let mut bad_utf8 = format!("{line}\n").into_bytes();
        bad_utf8.extend_from_slice(b"{\"question\": \"\xff\"}\n");
        let e = decode_text(&bad_utf8).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("UTF-8") && e.contains("byte 15"), "{e}");
        let e = err(r#"{"question": "Q", "options": ["a","b","A ","d"], "answer": "A"}"#);
        assert!(e.contains("`options`") && e.contains("options A and C are the same"), "{e}");
    }

    #[test]
    fn fingerprints_are_stable_and_distinct() {
        let it = parse_item(0, r#"{"question": "Q", "options": ["a","b","c","d"], "answer": "A"}"#)
            .unwrap();
        assert_eq!(it.fingerprint(), it.clone().fingerprint());
        assert_eq!(it.fingerprint().len(), 16);
        let other = McItem { question: "Q2".into(), ..it.clone() };
        assert_ne!(it.fingerprint(), other.fingerprint());
    }

    #[test]
    fn letters() {
        assert_eq!(letter(0), 'A');
        assert_eq!(letter(9), 'J');
        assert_eq!(letter_index('j'), Some(9));
        assert_eq!(letter_index('K'), None);
    }
}
