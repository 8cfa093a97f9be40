//! Tokenizer: HF `tokenizer.json` through the `tokenizers` crate (pure Rust build).

use std::path::Path;

use crate::error::{EngineError, Result};

/// A loaded HF tokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("vocab", &self.vocab_size()).finish()
    }
}

impl Tokenizer {
    /// Load `<dir>/tokenizer.json` (or a `tokenizer.json` path).
    ///
    /// # Errors
    /// [`EngineError::Tokenizer`] naming the file if it is missing or malformed.
    pub fn from_path(path: &Path) -> Result<Self> {
        let file = if path.is_dir() { path.join("tokenizer.json") } else { path.to_path_buf() };
        let inner = tokenizers::Tokenizer::from_file(&file)
            .map_err(|e| EngineError::Tokenizer(format!("{}: {e}", file.display())))?;
        Ok(Self { inner })
    }

    /// Vocabulary size including added tokens.
    #[must_use]
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Encode text to token ids (with the tokenizer's own special-token post-processing, as HF
    /// `tokenizer(text)`).
    ///
    /// # Errors
    /// [`EngineError::Tokenizer`] if encoding fails.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, true)
            .map_err(|e| EngineError::Tokenizer(format!("encoding {text:?}: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decode token ids to text (special tokens skipped).
    ///
    /// # Errors
    /// [`EngineError::Tokenizer`] if decoding fails (e.g. an unknown id).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| EngineError::Tokenizer(format!("decoding {ids:?}: {e}")))
    }

    /// The id of a token given in its string form (e.g. an added token `<|im_end|>`), if any.
    #[must_use]
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The string form of one token id, if it exists.
    #[must_use]
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }
}

/// Incremental detokenizer for streaming: feed ids one at a time, get the newly completed text.
/// Text is held back while it ends in an incomplete UTF-8 sequence (a byte-level BPE token may
/// carry half a character).
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    emitted: usize,
}

impl StreamDecoder {
    /// A decoder with no tokens yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Add `id`; return the text that became complete (possibly empty).
    ///
    /// # Errors
    /// [`EngineError::Tokenizer`] if decoding fails.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = tok.decode(&self.ids)?;
        if text.ends_with('\u{FFFD}') || text.len() < self.emitted {
            return Ok(String::new());
        }
        let new = text.get(self.emitted..).unwrap_or("").to_string();
        self.emitted = text.len();
        Ok(new)
    }

    /// Flush: the text not yet returned by [`Self::push`] (an incomplete UTF-8 tail decodes to
    /// U+FFFD here).
    ///
    /// # Errors
    /// [`EngineError::Tokenizer`] if decoding fails.
    pub fn finish(&mut self, tok: &Tokenizer) -> Result<String> {
        let text = tok.decode(&self.ids)?;
        let rest = text.get(self.emitted..).unwrap_or("").to_string();
        self.emitted = text.len();
        Ok(rest)
    }
}

/// Parse a comma-separated list of token ids (`--token-ids 1,2,3`).
///
/// # Errors
/// [`EngineError::Request`] naming the bad item.
pub fn parse_token_ids(s: &str) -> Result<Vec<u32>> {
    if s.trim().is_empty() {
        return Err(EngineError::Request("empty token id list".into()));
    }
    s.split(',')
        .map(str::trim)
        .map(|x| {
            if x.is_empty() {
                return Err(EngineError::Request(format!(
                    "empty token id in {s:?} (two commas in a row, or a leading/trailing comma)"
                )));
            }
            x.parse::<u32>()
                .map_err(|e| EngineError::Request(format!("bad token id {x:?} in {s:?}: {e}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixture_tokenizer_round_trips() {
        let dir = crate::paths::find_fixtures_dir().unwrap().join("tiny-causal");
        let tok = Tokenizer::from_path(&dir).unwrap();
        assert_eq!(tok.vocab_size(), 384);
        let text = "The gated delta rule";
        let ids = tok.encode(text).unwrap();
        // The golden file's prompt ids were made by HF tokenizers from the same tokenizer.json.
        let golden: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("golden_f32.json")).unwrap())
                .unwrap();
        let want: Vec<u32> = golden["cases"][0]["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(ids, want);
        assert_eq!(tok.decode(&ids).unwrap(), text);
        let mut sd = StreamDecoder::new();
        let streamed: String = ids.iter().map(|&i| sd.push(&tok, i).unwrap()).collect();
        assert_eq!(streamed, text);
    }

    #[test]
    fn token_id_lists() {
        assert_eq!(parse_token_ids("1, 2,3").unwrap(), vec![1, 2, 3]);
        assert!(parse_token_ids("1,x").unwrap_err().to_string().contains("\"x\""));
        // Review finding 18: empty entries are errors, not skipped.
        for bad in ["1,,2", "1,2,", ",1", "", " "] {
            assert!(parse_token_ids(bad).is_err(), "{bad:?}");
        }
    }
}
