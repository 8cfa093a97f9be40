//! Answer extraction: the option letter a completion commits to, or none.
//!
//! The rules, in order (the first stage that decides wins; nothing is ever guessed):
//!
//! 0. **Normalization.** Full-width forms (`Ｂ`, `：`, `（`) become ASCII. If the completion has a
//!    `</think>`, only the text after the last one is read; if it opens `<think>` and never closes
//!    it, the reasoning never finished: `unfinished_reasoning` (unanswered).
//!    **Next-item cut**: only the text before the first line (after the first) where a base model
//!    starts another item is read (`Question:`, `Question 2:`, `Q:`, `### Question`, `The
//!    following is a multiple-choice question`, MMLU's `The following are multiple choice
//!    questions`; see [`next_item_cut`]), whatever the template: `The answer is B.\n\nQ: ...
//!    Answer: C` is `B`. (A cut before a `<think>` applies first; one inside the reasoning does
//!    not hide the answer after `</think>`.)
//! 1. **Explicit markers** (case-insensitive). A marker phrase followed by a letter:
//!    `answer: X`, `answer is X`, `the correct/final/best answer is (X)`, `final answer: X`,
//!    `answer would/should be X`, `correct option/choice is X`, `answer is option X`,
//!    `answer: **X**`, `\boxed{X}` (also `\boxed{\text{X}}`); Chinese `答案是 X`, `答案：X`,
//!    `答案为 X`, `正确选项是 X`, `选 X` / `选择 X`; Spanish `la respuesta (correcta) es X`,
//!    `respuesta: X` (also with an article: `la respuesta correcta es la B`); French `la (bonne) réponse est X`, `réponse : X`; German
//!    `die (richtige) Antwort ist/lautet X`, `Antwort: X`; Portuguese `a resposta é X`; Italian
//!    `la risposta è X`; Japanese `答えは X`, `正解は X`. A few adverbs (`clearly`, `definitely`,
//!    ...) and the words `option` / `choice` / `letter` may sit between phrase and letter, and the
//!    letter may be wrapped in `( )`, `[ ]`, `** **`, `$ $`, quotes, `\text{ }`.
//!    The letter must end there: not followed by a letter or digit, `'x`, `-x` or `.x`
//!    (`Because`, `I'm`, `B-cell`, `e.g.`). A lowercase letter, or `A` / `I`, that is not wrapped
//!    and is followed by a lowercase word is prose (`the answer is a bit unclear`,
//!    `Answer: I think ...`) unless that word is a connector (`because`, `since`, `as`, `is`,
//!    `and`, ... see [`CONNECTORS`]): `Answer: A because ...` is an answer.
//!    **The last marker in the text wins.** If that last marker names a letter outside the
//!    item's options (`E` with 4 options, or `K..Z`), the item is unanswered (`invalid_letter`):
//!    an earlier, retracted answer is not used instead.
//!    A marker that names **more than one distinct letter** (`Answer: A or B`, `B and D`, `A/B`,
//!    `(B) or (C)`, `A, B, or C`, `Option B or Option D`, `\boxed{B,C}`, `答案是 A 和 C`) is
//!    ambiguous: unanswered (`ambiguous`), again without falling back to an earlier marker. So is a
//!    questioned marker letter (`The answer is B?`), and so is a **conditional** one: a condition
//!    follows in its clause, possibly in a bracketed aside (`B if we assume ...`, `B (if we
//!    ignore friction)`, `B; if France, A`, `B, otherwise C`, `unless`, `assuming`, `provided`,
//!    `when`), or its sentence opens with one (`If the UK is meant, the answer is B`; the hedge
//!    `If I had to pick, ...` is not a condition). The alternatives check looks past a bracketed
//!    aside (`B (with friction) or C`). A marker letter immediately qualified as
//!    wrong (`Answer: C is wrong`, `D is false`, `B is incorrect`, `isn't`, `can't be`) is not an
//!    answer: that marker is skipped.
//!    A lone bold letter `**X**` (or `**X.** text`) is a weaker marker: it counts only when no
//!    phrase marker exists (so `Answer: B ... **C** is wrong` gives `B`), again last one wins, and
//!    out-of-range bold letters, bold lowercase letters (`**a** trick question`), bold prose
//!    `A` / `I` and bold letters qualified as wrong are ignored.
//!
//!    **Corrections.** A correction cue at a clause start (`No -`, `no wait`, `Wait,`,
//!    `On reflection`, `on second thought`, `scratch that`, `I was wrong`, `等等`, `不对`)
//!    supersedes everything before it: if the last cue comes after the last marker's letter,
//!    the text after that cue decides (bold, standalone letter, option text); if it names
//!    nothing, the item is unanswered (`retracted`), never the retracted letter. Weak cues
//!    (`Actually, ...` at a clause start, and `No` right after a `?`, which answers a question
//!    rather than retracting) yield to a letter after them, but otherwise leave the earlier
//!    answer standing, unless the text after them names a different option (then: `ambiguous`).
//! 2. **Standalone letter.** A token that is exactly an option letter, optionally as `(X)`, `[X]`,
//!    `X.`, `X)` or `X:`: on its left only whitespace, `(`, `[`, `{`, `*`, a quote or CJK text;
//!    on its right only whitespace, `)`, `]`, `}`, `.`, `:`, `,`, `;`, `!`, `*`, a quote or
//!    CJK text; never inside a word (`At`, `I'm`, `U.S.`, `B-cell`, `x+B`), and not right after a
//!    negation (`not B`, `isn't B`, `except B`; see [`NEGATIONS`]). Lowercase counts only when
//!    parenthesized (`(b)`) or when it is the whole completion. Prose, unless the next word is a
//!    connector (`A is correct`): a capital `I` followed by a lowercase word (`I think`, the
//!    pronoun), and a capital `A` followed by a lowercase word at the start of a sentence (text or
//!    line start, or after `.`, `!`, `?`, `:`: `A good option is ...`, the article); mid-sentence
//!    `pick A over B` keeps `A` (the article there would be lowercase). Also not a letter:
//!    - a letter followed by `?` (`Is it C?`: a question, not an answer);
//!    - a letter qualified as wrong (`C is wrong`, as for markers);
//!    - **a letter that is part of a name**: an unwrapped letter directly after a word counts only
//!      if that word introduces a choice (`is`, `pick`, `choose`, `option`, `so`, `and`, ... see
//!      [`INTRODUCERS`]); after any other word it is read as part of a term (`vitamin C`,
//!      `Hepatitis B`, `Plan A`, `type B`). After punctuation, at a line start, or wrapped
//!      (`Paris (A)`) it is still a letter;
//!    - **a letter the text uses as a name elsewhere**: a letter after a capitalized word that is
//!      not an introducer or negation, or after a [`NAMING`] word (`Vitamin A`, `Matrix A`,
//!      `hepatitis B`), and each letter of a list continuing it (`Vitamin A, B, C`), is a name
//!      throughout the text: `... water soluble? No, A is fat soluble` is not `A`;
//!    - a label: a letter after `Word:` with a [`NAMING`] word (`Grade: A`, `Type: B`);
//!    - **math and units**: a letter right after a number (`2 A`, `300 K`, `1 J`), next to a math
//!      operator or `=` (`F = ma`, `I = V/R`, `x + B`; an arrow `-> B` / `=> B` is not math), a
//!      function-call argument (`P(A)`, `det(A)`), or a variable being introduced (`A be`, as in
//!      `Let A be ...`);
//!    - a conditional letter, as for markers (`A if x > 0`, `If France, A`);
//!    - a letter inside an occurrence of an option's text that contains it as a word (option
//!      `Vitamin C`: the `C` of `vitamin C`);
//!    - an abbreviation: `X.` followed by a lowercase word (`C. elegans`, `E. coli`) unless that
//!      word starts option X's own text (`C. the mitochondria`). This also applies to marker
//!      letters.
//!
//!    If some lines consist of a letter alone and they all name the same letter, that
//!    letter wins; otherwise, if all standalone letters name the same option, it wins; several
//!    different letters fall through to stage 3.
//! 3. **Option text.** Texts are normalized (lowercase, punctuation to spaces, whitespace
//!    collapsed) and matched as whole words. If exactly one option's full text occurs (an option
//!    whose every occurrence lies inside a longer matching option, such as `Paris` inside
//!    `Paris, Texas`, does not count), that option wins; several: unanswered.
//! 4. Otherwise: `unanswered` (method `none`, or `retracted` after a correction cue).
//!
//! When in doubt the rules leave the item unanswered: a missed answer costs one item, a guessed
//! one silently biases the accuracy.

use std::sync::LazyLock;

use regex::Regex;

use super::data::letter;

/// Words after a bare `A` / `I` / lowercase letter that make it an answer, not prose.
pub const CONNECTORS: &[&str] = &[
    "because",
    "since",
    "as",
    "is",
    "was",
    "seems",
    "appears",
    "which",
    "and",
    "or",
    "but",
    "so",
    "hence",
    "therefore",
    "given",
    "due",
    "per",
    "based",
];

/// Words skipped between a marker phrase and its letter.
const FILLERS: &[&str] = &[
    "clearly",
    "definitely",
    "probably",
    "likely",
    "most",
    "therefore",
    "thus",
    "indeed",
    "actually",
    "simply",
    "option",
    "choice",
    "letter",
    "opción",
    "opcion",
    "choix",
    "opção",
    "opzione",
    "la",
    "el",
];

/// Which rule decided an [`Extraction`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// An explicit marker phrase (`Answer: X`, `\boxed{X}`, `答案是 X`, ...).
    Marker,
    /// A lone bold letter `**X**` (no phrase marker present).
    Bold,
    /// A standalone option letter.
    Standalone,
    /// The text of exactly one option.
    OptionText,
    /// The last explicit marker names a letter the item does not have (unanswered).
    InvalidLetter,
    /// The last explicit marker names several distinct letters, or is a question (unanswered).
    Ambiguous,
    /// A correction cue retracted the earlier answer and nothing after it names one
    /// (unanswered).
    Retracted,
    /// `<think>` without `</think>`: the answer part never started (unanswered).
    UnfinishedReasoning,
    /// Nothing found (unanswered).
    None,
}

impl Method {
    /// The name used in the results file.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Marker => "marker",
            Method::Bold => "bold",
            Method::Standalone => "standalone",
            Method::OptionText => "option_text",
            Method::InvalidLetter => "invalid_letter",
            Method::Ambiguous => "ambiguous",
            Method::Retracted => "retracted",
            Method::UnfinishedReasoning => "unfinished_reasoning",
            Method::None => "none",
        }
    }
}

/// The outcome of [`extract`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extraction {
    /// The 0-based option index, if an answer was found.
    pub index: Option<usize>,
    /// The rule that decided.
    pub method: Method,
}

impl Extraction {
    /// The answer letter, if any.
    #[must_use]
    pub fn letter(&self) -> Option<char> {
        self.index.map(letter)
    }

    fn none(method: Method) -> Self {
        Self { index: None, method }
    }
}

// Constant patterns; `regex_patterns_compile` (below) checks them, so these never panic.
static MARKER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?i)(?:",
        r"\b(?:(?:final|correct|right|best|true)\s+)?answer(?:\s+(?:choice|option|letter))?",
        r"\s*(?:is|would\s+be|should\s+be|will\s+be|must\s+be|=|:|-)",
        r"|\b(?:final|correct|right|best)\s+(?:option|choice)\s*(?:is|would\s+be|should\s+be|:)",
        r"|\\boxed\s*\{|\\fbox\s*\{",
        r"|(?:正确|正確|最终|最終)(?:的)?(?:选项|選項|答案)\s*(?:应该是|应为|是|为|為|:)?",
        r"|答案\s*(?:应该是|應該是|应为|應為|应是|是|为|為|:)?",
        r"|选择?|選擇?",
        r"|答え\s*(?:は|:)|正解\s*(?:は|:)",
        r"|\bla\s+respuesta\s+(?:correcta\s+|final\s+)?(?:es|sería|seria)",
        r"|\brespuesta(?:\s+correcta|\s+final)?\s*:",
        r"|\bla\s+(?:bonne\s+)?r[ée]ponse\s+(?:correcte\s+|finale\s+)?(?:est|serait)",
        r"|\br[ée]ponse(?:\s+correcte|\s+finale)?\s*:",
        r"|\b(?:die\s+)?(?:richtige\s+|korrekte\s+)?antwort\s+(?:ist|lautet|wäre)",
        r"|\bantwort\s*:",
        r"|\ba\s+resposta\s+(?:correta\s+)?(?:é|e)\b",
        r"|\bla\s+risposta\s+(?:corretta\s+)?(?:è|e)\b",
        r")"
    ))
    .expect("constant marker pattern")
});

/// After a letter: it is qualified as wrong (`C is wrong`, `D is false`, `B isn't`).
static WRONG: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?i)^[\s)\]*'\x22]*(?:[,:\-\x{2013}\x{2014}]\s*)?",
        r"(?:(?:is|was|seems|appears|looks|sounds|would\s+be|must\s+be)\s+)?",
        r"(?:(?:definitely|clearly|obviously|also|certainly|simply|actually|probably)\s+)?",
        r"(?:wrong|false|incorrect|not\s+(?:correct|right|true|valid|the\s+(?:answer|correct|right|best))",
        r"|isn'?t\b|isn\x{2019}t\b|wasn'?t\b|can'?t\s+be|cannot\s+be|ruled\s+out|eliminated)"
    ))
    .expect("constant wrong pattern")
});

/// After a marker letter: another letter offered as an alternative (`or B`, `, C`, `/D`, `和 C`).
/// Group 1: an opening wrapper (if any); group 2: the letter.
static ALTERNATIVE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?i)^\s*(?:,\s*(?:(?:and|or)\b\s*)?|/|&|\+|\band\b|\bor\b|\bvs\.?|\bversus\b",
        r"|和|或者?|与|與|及|、|以及)\s*",
        r"(?:(?:maybe|perhaps|possibly|even|also|else|rather|probably)\s+)?",
        r"(?:(?:option|choice|letter)\s*)?",
        r"((?:\\text\{|\*\*|[(\[*\x22'$])*)\s*([A-Za-z])"
    ))
    .expect("constant alternative pattern")
});

/// A correction cue at a clause start: everything before it is superseded.
static CORRECTION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?i)(?:^|[\n.!?;:,(*\-\x{2013}\x{2014}\x{2026}])\s*(?:(?:but|oh|hmm+|hm|um|ah)[,.!]*\s+)?",
        r"(?:no(?:pe)?(?:\s*(?:[,.!;:\-\x{2013}\x{2014}\x{2026}]|wait\b))",
        r"|wait\b|actually\b",
        r"|on\s+(?:second\s+thought|(?:further\s+|more\s+)?reflection|closer\s+inspection)",
        r"|scratch\s+that|i\s+was\s+wrong|i\s+take\s+(?:that|it)\s+back",
        r"|let\s+me\s+(?:reconsider|correct)|correction\s*:)",
        r"|等等|不对|不對"
    ))
    .expect("constant correction pattern")
});

/// A line where a base model starts another item (`Question:`, `Q2:`, `### Question 3:`, the
/// MMLU header): the completion is read only up to it.
static NEXT_ITEM: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?i)\n[ \t]*(?:#{1,6}[ \t]*)?(?:(?:question|q)[ \t]*\d*[ \t]*:",
        r"|the\s+following\s+(?:is\s+a\s+multiple[ -]choice\s+question",
        r"|are\s+multiple[ -]choice\s+questions))"
    ))
    .expect("constant next-item pattern")
});

/// After a letter (and its closers): a condition in the same clause (`B if ...`, `B (if ...)`,
/// `B, assuming ...`, `B; otherwise ...`, `B unless ...`).
static CONDITION_AFTER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?i)^[ \t]*(?:\([^()\n]*[A-Za-z]{2}[^()\n]*\)[ \t]*)?",
        r"(?:[,;:\-\x{2013}\x{2014}][ \t]*)?\(?[ \t]*(?:(?:but|and|or|only|except)[ \t]+)?",
        r"(?:if|unless|assuming|provided|providing|supposing|when|whenever|otherwise|in\s+case)\b"
    ))
    .expect("constant condition pattern")
});

/// A sentence opening with a condition (`If the UK is meant, ...`); `If I had to pick, ...`
/// is a hedge, not a condition.
static CONDITION_LEAD: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?i)^[\s*_(\x22']*(?:if|unless|assuming|provided|providing|supposing|in\s+case)\b",
        r"[^,;]*[,;]"
    ))
    .expect("constant condition-lead pattern")
});

/// A hedge that looks like a leading condition but commits (`If I had to pick, ...`).
static HEDGE_LEAD: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)^[\s*_(\x22']*if\s+(?:i\s+(?:had|have|must)\b|forced\b|pressed\b)")
        .expect("constant hedge pattern")
});

/// A parenthesized aside (two or more letters of prose) before an alternative: `B (with
/// friction) or C`.
static ASIDE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\s*\([^()\n]*[A-Za-z]{2}[^()\n]*\)").expect("constant aside pattern")
});

static BOLD: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"\*\*\s*\(?\s*([A-Za-z])\s*\)?\s*[.:)]?\s*\*\*",
        r"|\*\*\s*\(?([A-Za-z])[.:)]\s+[^*\n]{1,200}\*\*"
    ))
    .expect("constant bold pattern")
});

/// A Latin-script word character (letters incl. accented, digits, `_`). CJK text around a
/// letter does not glue it into a word (`答案是B选项`).
fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || (c.is_alphabetic() && (c as u32) < 0x0250)
}

/// CJK text and punctuation (U+2E80 and up): it may touch a standalone letter (`选项C是`).
fn is_cjk(c: char) -> bool {
    (c as u32) >= 0x2E80 && !is_word_char(c) && c != '\u{FFFD}'
}

/// Full-width ASCII forms to ASCII, ideographic space to a space.
fn normalize_width(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '\u{FF01}'..='\u{FF5E}' => char::from_u32(c as u32 - 0xFEE0).unwrap_or(c),
            '\u{3000}' => ' ',
            _ => c,
        })
        .collect()
}

/// Whether the letter just before `rest` ends there: `rest` does not start with a word char,
/// `'x`, `-x` or `.x` (x a word char).
fn ends_token(rest: &str) -> bool {
    let mut it = rest.chars();
    match it.next() {
        Some(c) if is_word_char(c) => false,
        Some('\'' | '\u{2019}' | '-' | '.') => !it.next().is_some_and(is_word_char),
        _ => true,
    }
}

/// The word (alphabetic run) after leading whitespace, if `rest` starts with whitespace.
fn next_word(rest: &str) -> Option<&str> {
    let t = rest.trim_start();
    if t.len() == rest.len() {
        return None;
    }
    let end = t.find(|c: char| !c.is_alphabetic()).unwrap_or(t.len());
    Some(&t[..end]).filter(|w| !w.is_empty())
}

/// A bare letter followed by a lowercase non-connector word reads as prose (`a bit`, `I think`).
/// `sentence_start`: `A` counts as a possible article only there (mid-sentence the article is
/// lowercase); `I` and lowercase letters are always checked.
fn is_prose(letter: char, rest: &str, sentence_start: bool) -> bool {
    let risky = letter.is_ascii_lowercase() || letter == 'I' || (letter == 'A' && sentence_start);
    risky
        && next_word(rest).is_some_and(|w| {
            w.chars().next().is_some_and(char::is_lowercase) && !CONNECTORS.contains(&w)
        })
}

fn strip_any<'a>(s: &'a str, tokens: &[&str]) -> Option<&'a str> {
    tokens.iter().find_map(|t| s.strip_prefix(t))
}

const OPENERS: &[&str] = &[
    "\\boxed{",
    "\\textbf{",
    "\\text{",
    "\\mathrm{",
    "\\mathbf{",
    "**",
    "*",
    "(",
    "[",
    "{",
    "$",
    "\"",
    "'",
    "\u{201C}",
    "\u{2018}",
    "\u{300C}",
    "\u{3010}",
];
const CLOSERS: &[&str] =
    &["**", "*", ")", "]", "}", "$", "\"", "'", "\u{201D}", "\u{2019}", "\u{300D}", "\u{3011}"];

/// What a marker phrase points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MarkerLetter {
    /// One letter (uppercase), at this byte offset of the text after the phrase.
    One(char, usize),
    /// Several distinct letters, or a questioned letter (`B?`), at this offset.
    Ambiguous(usize),
}

/// `X.` followed by a lowercase word (`C. elegans`, `E. coli`) is an abbreviation, unless what
/// follows starts option X's own text (`C. the mitochondria`).
fn abbreviation(c: char, after: &str, options: &[String]) -> bool {
    let Some(r) = after.strip_prefix('.') else { return false };
    if !next_word(r).is_some_and(|w| w.chars().next().is_some_and(char::is_lowercase)) {
        return false;
    }
    let i = (c.to_ascii_uppercase() as usize).wrapping_sub('A' as usize);
    let own = options.get(i).map(|o| norm_words(o));
    !own.is_some_and(|o| !o.trim().is_empty() && norm_words(r).starts_with(&o))
}

/// Skip closing wrappers (`)`, `**`, quotes, ...) after a letter.
fn skip_closers(mut rest: &str) -> (&str, usize) {
    let mut closed = 0;
    loop {
        let r = rest.trim_start();
        match strip_any(r, CLOSERS) {
            Some(r2) => {
                closed += 1;
                rest = r2;
            }
            None => return (rest, closed),
        }
    }
}

/// Parse the letter a marker phrase points at, starting right after the phrase. `None` if no
/// letter follows, it reads as prose, or it is qualified as wrong.
fn letter_after_marker(s: &str, options: &[String]) -> Option<MarkerLetter> {
    let mut t = s.trim_start();
    if let Some(r) = t.strip_prefix(':') {
        t = r.trim_start();
    }
    // Fillers: "clearly", "option", ... (whole words only).
    for _ in 0..3 {
        let w_end = t.find(|c: char| !c.is_alphabetic()).unwrap_or(t.len());
        if w_end > 1 && FILLERS.iter().any(|f| t[..w_end].eq_ignore_ascii_case(f)) {
            t = t[w_end..].trim_start();
        } else {
            break;
        }
    }
    let mut opened = 0;
    while let Some(r) = strip_any(t, OPENERS) {
        opened += 1;
        t = r.trim_start();
    }
    let pos = s.len() - t.len();
    let c = t.chars().next().filter(char::is_ascii_alphabetic)?;
    let after = &t[1..];
    if !ends_token(after) {
        return None;
    }
    let (rest, closed) = skip_closers(after);
    let wrapped = opened > 0 && closed > 0;
    if !wrapped && (is_prose(c, rest, true) || abbreviation(c, after, options)) {
        return None;
    }
    if WRONG.is_match(rest) {
        return None;
    }
    if rest.trim_start().starts_with('?') || conditional("", after) {
        return Some(MarkerLetter::Ambiguous(pos));
    }
    let first = c.to_ascii_uppercase();
    // Alternatives: `or B`, `, C`, `/D`, ...
    let mut r = rest;
    for _ in 0..12 {
        r = ASIDE.find(r).map_or(r, |m| &r[m.end()..]); // `B (with friction) or C`
        let Some(caps) = ALTERNATIVE.captures(r) else { break };
        let (Some(open), Some(l)) = (caps.get(1), caps.get(2)) else { break };
        let c2 = l.as_str().chars().next().unwrap_or(' ');
        let after2 = &r[l.end()..];
        if !ends_token(after2) {
            break;
        }
        let (rest2, closed2) = skip_closers(after2);
        let wrapped2 = !open.as_str().is_empty() && closed2 > 0;
        if !wrapped2 && (c2.is_ascii_lowercase() || is_prose(c2, rest2, true)) {
            break;
        }
        if c2.to_ascii_uppercase() != first && !WRONG.is_match(rest2) {
            return Some(MarkerLetter::Ambiguous(pos));
        }
        r = rest2;
    }
    Some(MarkerLetter::One(first, pos))
}

/// Stage 1 (phrase markers): the last marker that names a letter, with the byte offset of that
/// letter in `text`.
fn last_marker(text: &str, options: &[String]) -> Option<(MarkerLetter, usize)> {
    let mut last = None;
    for m in MARKER.find_iter(text) {
        if let Some(mut ml) = letter_after_marker(&text[m.end()..], options) {
            let off = match ml {
                MarkerLetter::One(_, p) | MarkerLetter::Ambiguous(p) => m.end() + p,
            };
            if let MarkerLetter::One(_, p) = ml {
                if conditional(&text[..m.start()], "") {
                    ml = MarkerLetter::Ambiguous(p); // `If the UK is meant, the answer is B`
                }
            }
            last = Some((ml, off));
        }
    }
    last
}

/// Stage 1 (bold): the last valid lone bold letter.
fn bold_stage(text: &str, n: usize) -> Option<usize> {
    let mut bold = None;
    for caps in BOLD.captures_iter(text) {
        let Some(m) = caps.get(1).or_else(|| caps.get(2)) else { continue };
        let Some(c) = m.as_str().chars().next() else { continue };
        let whole = caps.get(0).map_or("", |w| w.as_str());
        let rest = &text[caps.get(0).map_or(m.end(), |w| w.end())..];
        let paren = whole.contains('(');
        if c.is_ascii_lowercase() && !paren {
            continue; // `**a** trick question`: the article
        }
        if !paren && (is_prose(c, rest, true) || WRONG.is_match(rest)) {
            continue;
        }
        let i = (c.to_ascii_uppercase() as usize).wrapping_sub('A' as usize);
        if i < n {
            bold = Some(i);
        }
    }
    bold
}

/// Words that negate the letter after them (`not B`, `isn't B`): that letter is not an answer.
pub const NEGATIONS: &[&str] = &["not", "never", "except", "nor", "neither", "excluding"];

/// Words after which a capital letter is a choice (`is B`, `pick A`, `option C`, `so D`). After
/// any other word a letter is read as part of a name or term (`vitamin C`, `Plan A`).
pub const INTRODUCERS: &[&str] = &[
    "is",
    "was",
    "be",
    "are",
    "were",
    "it's",
    "that's",
    "its",
    "answer",
    "answers",
    "option",
    "options",
    "choice",
    "choices",
    "letter",
    "pick",
    "picks",
    "picked",
    "choose",
    "chose",
    "chosen",
    "select",
    "selected",
    "with",
    "say",
    "said",
    "guess",
    "think",
    "believe",
    "and",
    "or",
    "but",
    "so",
    "thus",
    "hence",
    "therefore",
    "then",
    "between",
    "than",
    "over",
    "vs",
    "versus",
    "either",
    "both",
    "prefer",
    "take",
    "mark",
    "circle",
    "to",
    "for",
    "like",
    "of",
    "from",
    "definitely",
    "clearly",
    "probably",
    "likely",
    "surely",
    "certainly",
    "obviously",
    "maybe",
    "perhaps",
    "correct",
    "right",
    "final",
    "best",
    "also",
    "only",
    "just",
    "exactly",
    "remains",
    "leaves",
    "leaving",
    "namely",
    "go",
    "going",
    "try",
    "want",
    "would",
    "i'd",
    "i'll",
    "i'm",
    "towards",
    "toward",
    "lean",
    "leaning",
    "favor",
    "favour",
    "opt",
    "actually",
];

/// The word (letters and apostrophes) directly before `before`'s end, if `before` ends in a
/// single space/tab run after it (no punctuation between).
fn word_before(before: &str) -> Option<String> {
    let t = before.trim_end_matches([' ', '\t']);
    if t.len() == before.len() {
        return None;
    }
    let start = t
        .char_indices()
        .rev()
        .find(|&(_, c)| !(c.is_alphabetic() || c == '\'' || c == '\u{2019}'))
        .map_or(0, |(i, c)| i + c.len_utf8());
    let w = &t[start..];
    (!w.is_empty() && w.chars().any(char::is_alphabetic) && !w.chars().all(is_cjk))
        .then(|| w.to_lowercase().replace('\u{2019}', "'"))
}

/// Whether the letter `c` between `before` and `after` lies inside an occurrence of an option
/// text that contains it as a word together with other words (`vitamin C` for `Vitamin C`).
fn in_option_text(before: &str, c: char, after: &str, options: &[String]) -> bool {
    let lc = c.to_ascii_lowercase().to_string();
    let bw: Vec<String> = norm_words(before).split_whitespace().map(String::from).collect();
    let aw: Vec<String> = norm_words(after).split_whitespace().map(String::from).collect();
    options.iter().any(|o| {
        let ow: Vec<String> = norm_words(o).split_whitespace().map(String::from).collect();
        ow.len() > 1
            && ow
                .iter()
                .enumerate()
                .any(|(j, w)| *w == lc && bw.ends_with(&ow[..j]) && aw.starts_with(&ow[j + 1..]))
    })
}

/// Whether the word before a letter (`before` is the text up to it) is a negation.
fn negated(before: &str) -> bool {
    let t = before.trim_end_matches(|c: char| c.is_whitespace() || "([{*\"'".contains(c));
    let start = t
        .char_indices()
        .rev()
        .find(|&(_, c)| !(c.is_alphabetic() || c == '\'' || c == '\u{2019}'))
        .map_or(0, |(i, c)| i + c.len_utf8());
    let w = t[start..].to_lowercase();
    NEGATIONS.contains(&w.as_str()) || w.ends_with("n't") || w.ends_with("n\u{2019}t")
}

/// Where the completion stops being an answer to this item: the start of the first line
/// (after the first) where a base model starts another item (`Question:`, `Question 2:`, `Q:`,
/// `### Question`, `The following is a multiple-choice question`, MMLU's `The following are
/// multiple choice questions`; case-insensitive, after optional spaces and `#` marks).
#[must_use]
pub fn next_item_cut(completion: &str) -> Option<usize> {
    NEXT_ITEM.find(completion).map(|m| m.start())
}

/// Whether the letter between `before` (its sentence so far; earlier text may precede) and
/// `after` (right after the letter) is conditional: a condition follows in its clause
/// (`B if ...`, `B (if ...)`, `B; otherwise ...`) or its sentence opens with one
/// (`If the UK is meant, the answer is B`).
fn conditional(before: &str, after: &str) -> bool {
    let (rest, _) = skip_closers(after);
    if CONDITION_AFTER.is_match(rest) {
        return true;
    }
    let start = before.rfind(['.', '!', '?', '\n']).map_or(0, |i| i + 1);
    let sentence = &before[start..];
    CONDITION_LEAD.is_match(sentence) && !HEDGE_LEAD.is_match(sentence)
}

/// Words before `Word: X` that make `X` a label or name, not a choice (`Grade: A`, `Type: B`).
pub const NAMING: &[&str] = &[
    "grade",
    "type",
    "class",
    "group",
    "plan",
    "vitamin",
    "hepatitis",
    "matrix",
    "vector",
    "point",
    "set",
    "event",
    "blood",
    "section",
    "part",
    "category",
    "level",
    "rating",
    "score",
    "model",
    "version",
    "phase",
    "stage",
    "step",
    "figure",
    "table",
    "appendix",
    "exhibit",
    "row",
    "column",
    "size",
    "rank",
    "tier",
    "zone",
    "gate",
    "room",
    "unit",
    "species",
    "strain",
    "serotype",
];

/// The word before `Word:` / `Word :` at the end of `before`, lowercased.
fn label_before(before: &str) -> Option<String> {
    let t = before.trim_end_matches([' ', '\t']).strip_suffix(':')?;
    word_before(&format!("{} ", t.trim_end_matches([' ', '\t'])))
}

/// Math or measurement around a letter: a number right before it (`2 A`, `300 K`), a math
/// operator or `=` next to it (`F = ma`, `I = V/R`, `x + B`), or a function-call argument
/// (`P(A)`, `det(A)`).
fn math_letter(before: &str, after: &str) -> bool {
    const OPS: &[char] = &[
        '=', '+', '/', '^', '<', '>', '\u{00D7}', '\u{00F7}', '\u{2260}', '\u{2264}', '\u{2265}',
        '\u{2248}', '\u{2212}',
    ];
    let b1 = before.strip_suffix(' ').unwrap_or(before);
    if b1.ends_with(|c: char| c.is_ascii_digit()) {
        return true;
    }
    let b = before.trim_end();
    let arrow = b.ends_with("->") || b.ends_with("=>"); // `so -> B`: an arrow, not math
    if (b.ends_with(OPS) && !arrow) || after.trim_start().starts_with(OPS) {
        return true;
    }
    before
        .strip_suffix('(')
        .is_some_and(|b| b.ends_with(|c: char| c.is_alphanumeric()) && after.starts_with(')'))
}

/// Letters the text uses as part of a name (`Vitamin A`, `Plan B`, `Grade: A`, and each letter
/// of a list after such a name: `Vitamin A, B, C`). A bare mention of such a letter elsewhere in
/// the text may be that name, so it is not read as an answer either.
fn named_letters(ctx: &str) -> Vec<char> {
    let mut named = Vec::new();
    for line in ctx.lines() {
        let mut prev_named_end: Option<usize> = None;
        for (p, c) in line.char_indices() {
            if !c.is_ascii_uppercase() {
                continue;
            }
            let before = &line[..p];
            let after = &line[p + 1..];
            let left_ok = before.chars().next_back().is_none_or(char::is_whitespace);
            if !left_ok || !ends_token(after) {
                continue;
            }
            // A naming word, or a capitalized word that does not introduce a choice.
            let capitalized = before
                .trim_end()
                .rsplit(|ch: char| !ch.is_alphabetic())
                .next()
                .is_some_and(|w| w.starts_with(|ch: char| ch.is_uppercase()));
            let by_word = word_before(before).is_some_and(|w| {
                NAMING.contains(&w.as_str())
                    || (capitalized
                        && !INTRODUCERS.contains(&w.as_str())
                        && !NEGATIONS.contains(&w.as_str()))
            });
            let by_label = label_before(before).is_some_and(|w| NAMING.contains(&w.as_str()));
            let in_list = prev_named_end.is_some_and(|e| {
                let gap = line[e..p].trim().to_lowercase();
                matches!(gap.as_str(), "," | "/" | "&" | "and" | "or" | ", and" | ", or")
            });
            if by_word || by_label || in_list {
                named.push(c);
                prev_named_end = Some(p + 1);
            }
        }
    }
    named
}

/// Stage 2: standalone letters.
/// `ctx` is the whole text `text` is part of (for [`named_letters`]).
fn standalone_stage(text: &str, options: &[String], ctx: &str) -> Option<usize> {
    let n = options.len().min(super::data::MAX_OPTIONS);
    let named = named_letters(ctx);
    let whole = text.trim().trim_matches(|c: char| "()[].:*".contains(c) || c.is_whitespace());
    let mut any: Vec<usize> = Vec::new();
    let mut alone: Vec<usize> = Vec::new();
    for line in text.lines() {
        let lt = line.trim().trim_matches(|c: char| "()[].:*".contains(c) || c.is_whitespace());
        for (p, c) in line.char_indices() {
            if !c.is_ascii_alphabetic() {
                continue;
            }
            let i = (c.to_ascii_uppercase() as usize).wrapping_sub('A' as usize);
            if i >= n {
                continue;
            }
            let before = &line[..p];
            let after = &line[p + 1..];
            let left_ok = before.chars().next_back().is_none_or(|b| {
                b.is_whitespace() || "([{*\"'\u{201C}\u{2018}".contains(b) || is_cjk(b)
            });
            let right_ok = after.chars().next().is_none_or(|a| {
                a.is_whitespace() || ")]}.:,;!*\"'\u{201D}\u{2019}".contains(a) || is_cjk(a)
            });
            if !(left_ok && right_ok && ends_token(after)) || negated(before) {
                continue;
            }
            let paren = before.trim_end().ends_with(['(', '['])
                && after.trim_start().starts_with([')', ']']);
            let list_paren = after.starts_with(')');
            if c.is_ascii_lowercase() && !(paren || list_paren || whole.len() == 1) {
                continue;
            }
            let sentence_start =
                before.trim_end().is_empty() || before.trim_end().ends_with(['.', '!', '?', ':']);
            if !paren && is_prose(c, after, sentence_start) {
                continue;
            }
            let (rest, _) = skip_closers(after);
            if rest.trim_start().starts_with('?') || WRONG.is_match(rest) {
                continue; // `Is it C?`, `C is wrong`
            }
            if !paren
                && (word_before(before).is_some_and(|w| !INTRODUCERS.contains(&w.as_str()))
                    || abbreviation(c, after, options))
            {
                continue; // `vitamin C`, `Plan A`, `C. elegans`
            }
            if in_option_text(before, c, after, options) {
                continue;
            }
            let upper = c.to_ascii_uppercase();
            if named.contains(&upper)
                || label_before(before).is_some_and(|w| NAMING.contains(&w.as_str()))
                || math_letter(before, after)
                || next_word(after).is_some_and(|w| w == "be")
                || conditional(before, after)
            {
                continue; // `Vitamin A, B`, `Grade: A`, `2 A`, `F = ma`, `P(A)`, `Let A be`, `A if`
            }
            any.push(i);
            if lt.len() == 1 {
                alone.push(i);
            }
        }
    }
    let single = |v: &[usize]| v.first().copied().filter(|f| v.iter().all(|x| x == f));
    single(&alone).or_else(|| single(&any))
}

/// Lowercase, non-alphanumerics to spaces, whitespace collapsed, padded with one space each side.
fn norm_words(s: &str) -> String {
    let mut out = String::from(" ");
    for w in s
        .chars()
        .map(|c| if c.is_alphanumeric() { c } else { ' ' })
        .collect::<String>()
        .split_whitespace()
    {
        out.push_str(&w.to_lowercase());
        out.push(' ');
    }
    out
}

/// Stage 3: the text of exactly one option.
fn option_text_stage(text: &str, options: &[String]) -> Option<usize> {
    let hay = norm_words(text);
    let mut spans: Vec<(usize, Vec<(usize, usize)>)> = Vec::new();
    for (i, o) in options.iter().enumerate() {
        let needle = norm_words(o);
        if needle.trim().is_empty() {
            continue;
        }
        let v: Vec<(usize, usize)> =
            hay.match_indices(&needle).map(|(s, m)| (s, s + m.len())).collect();
        if !v.is_empty() {
            spans.push((i, v));
        }
    }
    let keep: Vec<usize> = spans
        .iter()
        .filter(|(i, v)| {
            // Dominated: every occurrence lies inside a longer matching option's occurrence.
            let dominated = v.iter().all(|&(s, e)| {
                spans.iter().any(|(j, w)| {
                    j != i && w.iter().any(|&(s2, e2)| s2 <= s && e <= e2 && e2 - s2 > e - s)
                })
            });
            !dominated
        })
        .map(|(i, _)| *i)
        .collect();
    match keep.as_slice() {
        [one] => Some(*one),
        _ => None,
    }
}

/// The last correction cue: the byte offset right after it, and whether it is weak (`actually`,
/// or `no` right after a question mark: `Is A correct? No.` answers a question rather than
/// retracting).
fn last_correction(text: &str) -> Option<(usize, bool)> {
    CORRECTION.find_iter(text).last().map(|m| {
        let s = m.as_str().to_lowercase();
        (m.end(), s.contains("actually") || s.starts_with('?'))
    })
}

/// The rules without correction cues: marker, bold, standalone, option text.
fn decide(text: &str, options: &[String], marker: Option<MarkerLetter>) -> Extraction {
    let n = options.len().min(super::data::MAX_OPTIONS);
    match marker {
        Some(MarkerLetter::Ambiguous(_)) => Extraction::none(Method::Ambiguous),
        Some(MarkerLetter::One(c, _)) => {
            let i = c as usize - 'A' as usize;
            if i < n {
                Extraction { index: Some(i), method: Method::Marker }
            } else {
                Extraction::none(Method::InvalidLetter)
            }
        }
        None => letters_or_text(text, options).unwrap_or(Extraction::none(Method::None)),
    }
}

/// Stages after the phrase markers: bold, standalone, option text.
fn letters_or_text(text: &str, options: &[String]) -> Option<Extraction> {
    let n = options.len().min(super::data::MAX_OPTIONS);
    if let Some(i) = bold_stage(text, n) {
        return Some(Extraction { index: Some(i), method: Method::Bold });
    }
    if let Some(i) = standalone_stage(text, options, text) {
        return Some(Extraction { index: Some(i), method: Method::Standalone });
    }
    option_text_stage(text, options)
        .map(|i| Extraction { index: Some(i), method: Method::OptionText })
}

/// Extract the answer of `completion` for an item with `options` (4..=10; letters `A..`).
/// See the module docs for the rules.
#[must_use]
pub fn extract(completion: &str, options: &[String]) -> Extraction {
    let mut norm = normalize_width(completion);
    if let Some(cut) = next_item_cut(&norm).filter(|&c| norm.find("<think>").is_none_or(|t| c < t))
    {
        norm.truncate(cut);
    }
    let text = if let Some(p) = norm.rfind("</think>") {
        &norm[p + "</think>".len()..]
    } else if norm.contains("<think>") {
        return Extraction::none(Method::UnfinishedReasoning);
    } else {
        norm.as_str()
    };
    let text = &text[..next_item_cut(text).unwrap_or(text.len())];
    let marker = last_marker(text, options);
    let Some((cue, weak)) = last_correction(text) else {
        return decide(text, options, marker.map(|m| m.0));
    };
    if let Some((ml, _)) = marker.filter(|&(_, off)| off >= cue) {
        return decide(text, options, Some(ml));
    }
    // The last cue comes after the last marker: the text after it decides.
    let tail = &text[cue..];
    let n = options.len().min(super::data::MAX_OPTIONS);
    if let Some(i) = bold_stage(tail, n) {
        return Extraction { index: Some(i), method: Method::Bold };
    }
    if let Some(i) = standalone_stage(tail, options, text) {
        return Extraction { index: Some(i), method: Method::Standalone };
    }
    let tail_text = option_text_stage(tail, options);
    if !weak {
        // A retraction: its option text, else unanswered; never the retracted letter.
        return tail_text.map_or(Extraction::none(Method::Retracted), |i| Extraction {
            index: Some(i),
            method: Method::OptionText,
        });
    }
    // A weak cue (`Actually, ...`): what came before stands unless the tail names another option.
    let base = decide(text, options, marker.map(|m| m.0));
    match (tail_text, base.index) {
        (Some(t), Some(b)) if t != b => Extraction::none(Method::Ambiguous),
        (Some(t), None) => Extraction { index: Some(t), method: Method::OptionText },
        _ => base,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regex_patterns_compile() {
        assert!(MARKER.is_match("answer: B"));
        assert!(BOLD.is_match("**B**"));
    }

    #[test]
    fn helpers() {
        assert_eq!(normalize_width("答案：Ｂ"), "答案:B");
        assert!(ends_token(". Next"));
        assert!(!ends_token(".g."));
        assert!(!ends_token("'m"));
        assert!(is_prose('A', " good option", true));
        assert!(!is_prose('A', " over B", false));
        assert!(is_prose('I', " think", false));
        assert!(!is_prose('A', " because", true));
        assert!(!is_prose('B', " good", true));
        assert_eq!(norm_words("Paris, TEXAS!"), " paris texas ");
    }
}
