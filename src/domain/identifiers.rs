//! The identifiers of one run that never leave the harness (CONTRACT §3): its tool call ids
//! and its Redis keys.
//!
//! Entry points: [`RunIdentifiers::of_run`] (the run's call ids and the key prefix),
//! [`RunIdentifiers::pieces`] (a text split into literal pieces and identifiers, the basis
//! of every masked copy, see [`super::bounded`]) and [`draft_names_identifier`] (the
//! EvidenceGuard rule for Draft text: a repair may not change text, so it cannot be fixed).
//!
//! Text is searched as people read it ([`super::text::as_read`]): without the invisible
//! controls the judge's request drops, NFKC-normalised. A call id is found only as a whole token: not preceded or followed by a character in
//! `[A-Za-z0-9_-]`, so `c-1` is not found in `c-10` or `abc-1`. A Redis key is any
//! substring that starts with `P:run:` or `P:release:` and runs to the next whitespace or
//! quote character.

use std::borrow::Cow;

use foldhash::HashSet;
use memchr::memmem;

use super::draft::{AnalysisKind, Draft};
use super::evidence_guard::{ResolvedRun, Rule, Violation};
use super::text::{as_read, visible};

/// What a call id becomes in a masked copy.
pub const CALL_ID_MASK: &str = "[call id]";
/// What a Redis key becomes in a masked copy.
pub const REDIS_KEY_MASK: &str = "[redis key]";

/// Characters that make up a token: a call id next to one of these is part of a longer
/// word and is not that call id.
pub fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// [`is_token_char`] for one byte of UTF-8 text (a byte of a multi-byte character is never
/// a token character).
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// Where a Redis key written into text ends.
fn ends_key(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '`')
}

/// The run's call ids and the beginnings of its Redis keys.
#[derive(Debug, Clone)]
pub struct RunIdentifiers {
    call_ids: HashSet<String>,
    /// The distinct lengths of the call ids, longest first: at one position the longest
    /// id wins.
    lengths: Vec<usize>,
    /// The bytes some call id starts with: most positions are ruled out by them.
    first_bytes: ByteSet,
    /// How a text is searched for the places where an identifier may start.
    starts: Starts,
    /// `P:run:` and `P:release:`.
    key_markers: [String; 2],
    /// The length of the shortest identifier there can be (a call id, or a key marker): a
    /// shorter text holds none.
    shortest: usize,
}

/// Where an identifier may start in a text. A position not found here starts none; a
/// position found is checked by [`RunIdentifiers::match_at`].
// One per run and never in a collection: boxing the searchers would only add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
enum Starts {
    /// Every position (the reference the tests compare the search with).
    #[cfg(test)]
    Everywhere,
    /// The key markers' common beginning (`P:r`), and the call ids' starts: their common
    /// beginning when it has two bytes or more (agents' ids usually share one, like
    /// `call_`), else their first bytes. Both are searched with `memchr`'s SIMD searchers.
    Search {
        marker: memmem::Finder<'static>,
        ids: IdStarts,
    },
}

#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
enum IdStarts {
    /// No call id.
    None,
    /// The ids' common beginning, at least two bytes.
    Prefix(memmem::Finder<'static>),
    /// The ids' first bytes: `memchr` looks for up to three, more are looked up one
    /// byte at a time in `first_bytes`.
    Bytes(Vec<u8>),
}

/// Where the next start of one kind is, as far as a text has been searched: each kind's
/// searcher reads each byte of a text at most once, however often the other finds
/// something that is not an identifier.
#[derive(Debug, Clone, Copy, Default)]
enum Ahead {
    #[default]
    Unsearched,
    At(usize),
    Nowhere,
}

impl Ahead {
    /// The first start at or after `from`: the one found before if it is still ahead,
    /// else what `search` finds from `from`.
    fn from(&mut self, from: usize, search: impl FnOnce() -> Option<usize>) -> Option<usize> {
        match *self {
            Ahead::At(at) if at >= from => Some(at),
            Ahead::Nowhere => None,
            _ => {
                let found = search();
                *self = found.map_or(Ahead::Nowhere, Ahead::At);
                found
            }
        }
    }
}

/// The common beginning of `texts` (bytes; empty for none).
fn common_prefix<'a>(mut texts: impl Iterator<Item = &'a [u8]>) -> &'a [u8] {
    let Some(first) = texts.next() else {
        return &[];
    };
    texts.fold(first, |prefix, text| {
        let len = prefix.iter().zip(text).take_while(|(a, b)| a == b).count();
        &prefix[..len]
    })
}

/// A set of bytes, one bit each.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct ByteSet([u64; 4]);

impl ByteSet {
    fn insert(&mut self, b: u8) {
        self.0[usize::from(b >> 6)] |= 1 << (b & 63);
    }

    fn contains(&self, b: u8) -> bool {
        self.0[usize::from(b >> 6)] >> (b & 63) & 1 == 1
    }

    /// The bytes in the set, in ascending order.
    fn iter(&self) -> impl Iterator<Item = u8> + '_ {
        (0u8..4).flat_map(move |word| {
            let mut bits = self.0[usize::from(word)];
            std::iter::from_fn(move || {
                let bit = u8::try_from(bits.trailing_zeros())
                    .ok()
                    .filter(|&b| b < 64)?;
                bits &= bits - 1;
                Some(word * 64 + bit)
            })
        })
    }
}

/// An identifier found in a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    CallId(String),
    RedisKey,
}

impl Found {
    /// For an audit detail: the kind of identifier, never the text around it.
    pub fn describe(&self) -> &'static str {
        match self {
            Found::CallId(_) => "a tool call id of this run",
            Found::RedisKey => "a Redis key of this run's prefix",
        }
    }
}

/// One piece of a text: literal text, or an identifier to mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    Text(&'a str),
    CallId(&'a str),
    RedisKey(&'a str),
}

impl<'a> Piece<'a> {
    /// The piece as a masked copy shows it.
    pub fn masked(&self) -> &'a str {
        match self {
            Piece::Text(text) => text,
            Piece::CallId(_) => CALL_ID_MASK,
            Piece::RedisKey(_) => REDIS_KEY_MASK,
        }
    }

    /// The identifier this piece is, if it is one.
    pub fn found(&self) -> Option<Found> {
        match self {
            Piece::Text(_) => None,
            Piece::CallId(id) => Some(Found::CallId(id.to_string())),
            Piece::RedisKey(_) => Some(Found::RedisKey),
        }
    }
}

impl RunIdentifiers {
    /// `call_ids` (blank ones are ignored) and the key prefix `P` (`redis.key_prefix`).
    pub fn new<I, S>(call_ids: I, key_prefix: &str) -> RunIdentifiers
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str> + Into<String>,
    {
        // An id given twice (a run's calls list, then its records) is copied once.
        let mut ids: HashSet<String> = HashSet::default();
        for id in call_ids {
            let text = id.as_ref();
            if !text.trim().is_empty() && !ids.contains(text) {
                ids.insert(id.into());
            }
        }
        let call_ids = ids;
        let mut lengths: Vec<usize> = call_ids.iter().map(String::len).collect();
        lengths.sort_unstable_by(|a, b| b.cmp(a));
        lengths.dedup();
        let mut first_bytes = ByteSet::default();
        for id in &call_ids {
            first_bytes.insert(id.as_bytes()[0]);
        }
        let key_markers = [
            [key_prefix, ":run:"].concat(),
            [key_prefix, ":release:"].concat(),
        ];
        let marker = memmem::Finder::new(common_prefix(key_markers.iter().map(|m| m.as_bytes())))
            .into_owned();
        let prefix = common_prefix(call_ids.iter().map(|id| id.as_bytes()));
        let ids = if call_ids.is_empty() {
            IdStarts::None
        } else if prefix.len() >= 2 {
            IdStarts::Prefix(memmem::Finder::new(prefix).into_owned())
        } else {
            IdStarts::Bytes(first_bytes.iter().collect())
        };
        let shortest = key_markers
            .iter()
            .map(String::len)
            .chain(lengths.last().copied())
            .min()
            .unwrap_or(0);
        RunIdentifiers {
            call_ids,
            lengths,
            first_bytes,
            starts: Starts::Search { marker, ids },
            key_markers,
            shortest,
        }
    }

    /// The run's call ids: its calls list, and every cited id that has a record under the
    /// run (usable or rejected for any reason but a missing record).
    pub fn of_run(run: &ResolvedRun, key_prefix: &str) -> RunIdentifiers {
        let recorded = run.usable.keys().chain(
            run.rejected
                .iter()
                .filter(|(_, rejection)| rejection.rule != Rule::CallMissing)
                .map(|(id, _)| id),
        );
        RunIdentifiers::new(run.calls.iter().chain(recorded), key_prefix)
    }

    pub fn is_call_id(&self, text: &str) -> bool {
        self.call_ids.contains(text)
    }

    /// `text` as literal pieces and identifiers, left to right. Lazy: a caller that needs
    /// only the first few hundred bytes of a large text reads only about that much of it.
    pub fn pieces<'a>(&'a self, text: &'a str) -> Pieces<'a> {
        // A text too short to hold an identifier is not searched: it is one literal piece.
        let ahead = if self.too_short(text) {
            Ahead::Nowhere
        } else {
            Ahead::Unsearched
        };
        Pieces {
            ids: self,
            text,
            pos: 0,
            pending: None,
            marker_ahead: ahead,
            id_ahead: ahead,
        }
    }

    /// `text` as shown ([`RunIdentifiers::shown`]) with every identifier masked (not
    /// bounded: see [`super::bounded`] for that).
    pub fn mask(&self, text: &str) -> String {
        let text = self.shown(text);
        self.pieces(&text).map(|piece| piece.masked()).collect()
    }

    /// [`Self::mask`] of a text the caller owns: the text itself, not a copy, when nothing
    /// in it is masked or changed (the audit's copy of a Draft, most of the time).
    pub fn mask_owned(&self, text: String) -> String {
        let unchanged = {
            let shown = self.shown(&text);
            let mut pieces = self.pieces(&shown);
            matches!(shown, Cow::Borrowed(_))
                && matches!(
                    (pieces.next(), pieces.next()),
                    (Some(Piece::Text(whole)), None) if whole.len() == text.len()
                )
        };
        match unchanged {
            true => text,
            false => self.mask(&text),
        }
    }

    /// What a copy of `text` shows, in which identifiers are then masked: `text` without
    /// its invisible controls ([`visible`]), and NFKC-normalised ([`as_read`]) only when
    /// that form names an identifier the visible one hides (a fullwidth `ｃ－７`); otherwise
    /// the characters NFKC would fold (`…`, `ﬁ`) are kept. Borrowed when nothing changes.
    pub fn shown<'t>(&self, text: &'t str) -> Cow<'t, str> {
        if text.is_ascii() {
            return Cow::Borrowed(text);
        }
        let visible = visible(text);
        let read = match as_read(&visible) {
            Cow::Owned(read) => Some(read),
            Cow::Borrowed(_) => None,
        };
        match read {
            Some(read) if self.first_in_exact(&read).is_some() => Cow::Owned(read),
            _ => visible,
        }
    }

    /// The first identifier in `text` as people read it ([`as_read`]: an invisible control
    /// or a fullwidth form inside an id does not hide it), if any.
    pub fn first_in(&self, text: &str) -> Option<Found> {
        self.first_in_exact(&as_read(text))
    }

    /// The first identifier in `text` as it is written.
    fn first_in_exact(&self, text: &str) -> Option<Found> {
        // Most texts checked are a scope's short values: not even a split to start.
        if self.too_short(text) {
            return None;
        }
        self.pieces(text).find_map(|piece| piece.found())
    }

    /// Whether `text` is shorter than any identifier of the run, so holds none.
    fn too_short(&self, text: &str) -> bool {
        text.len() < self.shortest
    }

    /// The length of a call id that ends `text` as a whole token (the end counts as a
    /// boundary), if one does: a cut right after it would otherwise show it.
    pub fn call_id_at_end(&self, text: &str) -> Option<usize> {
        self.lengths.iter().copied().find(|&len| {
            len <= text.len()
                && text.is_char_boundary(text.len() - len)
                && self.call_ids.contains(&text[text.len() - len..])
                && !text[..text.len() - len]
                    .chars()
                    .next_back()
                    .is_some_and(is_token_char)
        })
    }

    /// The first position at or after `from` where a call id or a key may start (see
    /// [`Starts`]), searching on from what `marker` and `id` found before.
    fn next_start(
        &self,
        bytes: &[u8],
        from: usize,
        marker_ahead: &mut Ahead,
        id_ahead: &mut Ahead,
    ) -> Option<usize> {
        let rest = bytes.get(from..)?;
        let (marker, ids) = match &self.starts {
            #[cfg(test)]
            // Every character boundary (no UTF-8 continuation byte).
            Starts::Everywhere => return (from..bytes.len()).find(|&i| (bytes[i] as i8) >= -0x40),
            Starts::Search { marker, ids } => (marker, ids),
        };
        let at = |i: Option<usize>| i.map(|i| from + i);
        let key = marker_ahead.from(from, || at(marker.find(rest)));
        let id = id_ahead.from(from, || {
            at(match ids {
                IdStarts::None => None,
                IdStarts::Prefix(prefix) => prefix.find(rest),
                IdStarts::Bytes(b) => match b[..] {
                    [a] => memchr::memchr(a, rest),
                    [a, b] => memchr::memchr2(a, b, rest),
                    [a, b, c] => memchr::memchr3(a, b, c, rest),
                    _ => rest.iter().position(|&b| self.first_bytes.contains(b)),
                },
            })
        });
        match (key, id) {
            (Some(k), Some(i)) => Some(k.min(i)),
            (k, i) => k.or(i),
        }
    }

    /// The identifier starting at byte `at` of `text`, and where it ends. `prev_token`:
    /// whether the character before `at` (as the copy shows it) is a token character.
    fn match_at<'a>(
        &self,
        text: &'a str,
        at: usize,
        prev_token: bool,
    ) -> Option<(Piece<'a>, usize)> {
        let rest = &text[at..];
        let first = *rest.as_bytes().first()?;
        for marker in &self.key_markers {
            if marker.as_bytes()[0] == first && rest.starts_with(marker.as_str()) {
                let len = rest.find(ends_key).unwrap_or(rest.len());
                return Some((Piece::RedisKey(&rest[..len]), at + len));
            }
        }
        if prev_token || !self.first_bytes.contains(first) {
            return None;
        }
        self.lengths.iter().find_map(|&len| {
            let candidate = rest.get(..len)?;
            let after = &rest[len..];
            // A key right after it is masked, and its mask starts with `[`.
            let whole = self.call_ids.contains(candidate)
                && (!after.chars().next().is_some_and(is_token_char)
                    || self
                        .key_markers
                        .iter()
                        .any(|m| after.starts_with(m.as_str())));
            whole.then_some((Piece::CallId(candidate), at + len))
        })
    }
}

/// The pieces of a text ([`RunIdentifiers::pieces`]).
pub struct Pieces<'a> {
    ids: &'a RunIdentifiers,
    text: &'a str,
    pos: usize,
    /// An identifier found after a literal piece, returned next.
    pending: Option<(Piece<'a>, usize)>,
    marker_ahead: Ahead,
    id_ahead: Ahead,
}

impl<'a> Iterator for Pieces<'a> {
    type Item = Piece<'a>;

    fn next(&mut self) -> Option<Piece<'a>> {
        if let Some((piece, end)) = self.pending.take() {
            self.pos = end;
            return Some(piece);
        }
        if self.pos >= self.text.len() {
            return None;
        }
        // A piece starts at the text's start or right after an identifier, whose mask ends
        // with `]`: either way no token character precedes it. Token characters are ASCII,
        // so the byte before a position tells whether a token character precedes it, and
        // only bytes that can start a key marker or a call id (never a UTF-8 continuation
        // byte, so always at a character boundary) are looked at more closely.
        let bytes = self.text.as_bytes();
        let mut from = self.pos;
        while let Some(at) =
            self.ids
                .next_start(bytes, from, &mut self.marker_ahead, &mut self.id_ahead)
        {
            from = at + 1;
            let prev_token = at > self.pos && is_token_byte(bytes[at - 1]);
            if let Some((piece, end)) = self.ids.match_at(self.text, at, prev_token) {
                if at == self.pos {
                    self.pos = end;
                    return Some(piece);
                }
                self.pending = Some((piece, end));
                let literal = &self.text[self.pos..at];
                self.pos = at;
                return Some(Piece::Text(literal));
            }
        }
        let literal = &self.text[self.pos..];
        self.pos = self.text.len();
        Some(Piece::Text(literal))
    }
}

/// EvidenceGuard rule `draft_names_identifier`: every user-visible text of the Draft
/// (conclusion, analysis ids, kinds and texts, action plan, recommendations, limitations,
/// missing context) must name none of the run's call ids and none of its Redis keys. One
/// violation per field; the detail names the field, never its text.
pub fn draft_names_identifier(draft: &Draft, ids: &RunIdentifiers) -> Vec<Violation> {
    let mut violations = Vec::new();
    // The field's path is written only for a field that names an identifier.
    let mut check = |at: &dyn Fn() -> String, what: &str, text: &str| {
        if let Some(found) = ids.first_in(text) {
            violations.push(Violation {
                rule: Rule::DraftNamesIdentifier,
                at: at(),
                detail: format!(
                    "{what} names {}; a repair may not change text",
                    found.describe()
                ),
                tool_call_id: match found {
                    Found::CallId(id) => Some(id),
                    Found::RedisKey => None,
                },
            });
        }
    };
    if let Some(conclusion) = &draft.conclusion {
        check(
            &|| "conclusion".into(),
            "the conclusion text",
            &conclusion.text,
        );
    }
    for (i, analysis) in draft.analyses.iter().enumerate() {
        let at = || format!("analyses[{i}]");
        check(&at, "the analysis id", &analysis.id);
        if let AnalysisKind::Unsupported(kind) = &analysis.kind {
            check(&at, "the analysis kind", kind);
        }
        check(&at, "the analysis text", &analysis.text);
    }
    for (i, item) in draft.action_plan.iter().enumerate() {
        check(&|| format!("action_plan[{i}]"), "the text", &item.text);
    }
    for (i, item) in draft.recommendations.iter().enumerate() {
        check(&|| format!("recommendations[{i}]"), "the text", &item.text);
    }
    for (i, text) in draft.limitations.iter().enumerate() {
        check(&|| format!("limitations[{i}]"), "the limitation", text);
    }
    for (i, text) in draft.missing_context.iter().enumerate() {
        check(
            &|| format!("missing_context[{i}]"),
            "the missing context",
            text,
        );
    }
    violations
}

/// `value` as 32 lowercase hex digits (what `format!("{value:032x}")` writes), appended to
/// `out`: how the harness writes its random nonces and lock tokens.
pub fn push_hex(out: &mut String, value: u128) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.extend(
        (0..32)
            .rev()
            .map(|i| DIGITS[(value >> (i * 4)) as usize & 0xf] as char),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::evidence_guard::tests::{good_draft, run_evidence};

    fn ids() -> RunIdentifiers {
        RunIdentifiers::new(["c-1", "call-log-01", "a.b", "a.b.c"], "aiops")
    }

    fn masked(ids: &RunIdentifiers, text: &str) -> String {
        ids.pieces(text).map(|p| p.masked()).collect()
    }

    proptest::proptest! {
        #[test]
        fn hex_is_what_format_writes(value: u128) {
            let mut out = String::from("x/");
            push_hex(&mut out, value);
            proptest::prop_assert_eq!(out, format!("x/{value:032x}"));
        }

        /// A byte set holds exactly the bytes put in it, listed in order.
        #[test]
        fn a_byte_set_lists_its_bytes(bytes in proptest::collection::btree_set(proptest::num::u8::ANY, 0..20)) {
            let mut set = ByteSet::default();
            for &b in &bytes {
                set.insert(b);
            }
            proptest::prop_assert_eq!(set.iter().collect::<Vec<_>>(), bytes.iter().copied().collect::<Vec<_>>());
            proptest::prop_assert!((0..=u8::MAX).all(|b| set.contains(b) == bytes.contains(&b)));
        }

        /// The search for starts (a common id prefix, first bytes, the key markers' common
        /// beginning) splits a text exactly as trying every position does.
        #[test]
        fn searching_for_starts_finds_what_trying_every_position_finds(
            text in "[ca1.b:-P aiopsrunelé\"]{0,60}|[cal1l:aiops_-]{0,80}",
            ids in proptest::sample::select(vec![
                vec!["c-1", "c-1.b"],
                vec!["call-1", "call-12", "ca"],
                vec!["c-1", "a.b", "1", "p:"],
                vec!["é1", "é2"],
                vec![],
            ]),
        ) {
            let fast = RunIdentifiers::new(ids, "aiops");
            let slow = RunIdentifiers { starts: Starts::Everywhere, ..fast.clone() };
            let a: Vec<_> = fast.pieces(&text).collect();
            let b: Vec<_> = slow.pieces(&text).collect();
            // (The fast split and `first_in` skip a text too short for any identifier; the
            // slow one tries every position of every text.) `first_in` finds the first
            // identifier of the split.
            let first = b.iter().find_map(Piece::found);
            proptest::prop_assert_eq!(a, b);
            proptest::prop_assert_eq!(fast.first_in(&text), first);
        }

        /// Masking an owned text answers what masking a borrowed one does, whether it keeps
        /// the text (nothing to mask) or copies it.
        #[test]
        fn masking_an_owned_text_is_masking_it(
            text in "[ca1.b:-P aiopsrunelé\"\u{200b}ｃ－]{0,60}",
        ) {
            let ids = RunIdentifiers::new(["c-1", "a.b"], "aiops");
            proptest::prop_assert_eq!(ids.mask_owned(text.clone()), ids.mask(&text));
        }
    }

    /// A text exactly as long as the run's shortest identifier is still searched (shorter
    /// ones are not: they cannot hold one).
    #[test]
    fn a_text_as_short_as_an_identifier_is_searched() {
        for ids in [
            vec!["c-1", "c-1.b"],
            vec!["call-1", "call-12", "ca"],
            vec!["c-1", "a.b", "1", "p:"],
            vec!["é1", "é2"],
        ] {
            let run = RunIdentifiers::new(ids.clone(), "aiops");
            for id in ids {
                assert_eq!(run.first_in(id), Some(Found::CallId(id.to_string())));
                assert_eq!(run.pieces(id).collect::<Vec<_>>(), vec![Piece::CallId(id)]);
            }
        }
        let keys_only = RunIdentifiers::new(Vec::<String>::new(), "aiops");
        assert_eq!(keys_only.first_in("aiops:run:"), Some(Found::RedisKey));
        assert_eq!(keys_only.first_in("aiops:run"), None);
        assert_eq!(
            keys_only.pieces("aiops:run:").collect::<Vec<_>>(),
            vec![Piece::RedisKey("aiops:run:")]
        );
    }

    #[test]
    fn ids_with_a_common_beginning_are_searched_for_by_it() {
        let starts = |ids: &[&str]| RunIdentifiers::new(ids.iter().copied(), "aiops").starts;
        let Starts::Search { marker, ids } = starts(&["call_a1", "call_b2"]) else {
            panic!("a search");
        };
        assert_eq!(marker.needle(), b"aiops:r");
        assert!(matches!(ids, IdStarts::Prefix(p) if p.needle() == b"call_"));
        assert!(
            matches!(starts(&["a1", "b2"]), Starts::Search { ids: IdStarts::Bytes(b), .. } if b == b"ab")
        );
        assert!(
            matches!(starts(&["a", "b", "c", "d"]), Starts::Search { ids: IdStarts::Bytes(b), .. } if b == b"abcd")
        );
        assert!(matches!(
            starts(&[]),
            Starts::Search {
                ids: IdStarts::None,
                ..
            }
        ));
    }

    /// Many near-misses of one kind do not make the other kind's search start over: a
    /// megabyte of `call_x ` with one key at the end is split in one pass of each search.
    #[test]
    fn near_misses_do_not_rescan_the_text() {
        let ids = RunIdentifiers::new(["call_abc"], "aiops");
        let text = "call_x ".repeat(150_000) + "aiops:run:{r}";
        let pieces: Vec<_> = ids.pieces(&text).collect();
        assert_eq!(pieces.len(), 2);
        assert_eq!(pieces[1], Piece::RedisKey("aiops:run:{r}"));
    }

    #[test]
    fn call_ids_are_found_only_as_whole_tokens() {
        let ids = ids();
        assert_eq!(masked(&ids, "c-1"), "[call id]");
        assert_eq!(
            masked(&ids, "see c-1, then (c-1)."),
            "see [call id], then ([call id])."
        );
        for word in ["c-10", "xc-1", "c-1_x", "abc-1", "c-1-2", "C-1"] {
            assert_eq!(masked(&ids, word), word, "{word} is another word");
        }
        assert_eq!(
            masked(&ids, "é c-1é"),
            "é [call id]é",
            "non-ASCII is a boundary"
        );
        assert_eq!(masked(&ids, "call-log-01:c-1"), "[call id]:[call id]");
    }

    #[test]
    fn the_longest_call_id_wins_at_a_position() {
        assert_eq!(masked(&ids(), "a.b.c a.b"), "[call id] [call id]");
        assert_eq!(masked(&ids(), "a.b.d"), "[call id].d");
    }

    #[test]
    fn redis_keys_are_masked_to_the_next_whitespace_or_quote() {
        let ids = ids();
        assert_eq!(
            masked(&ids, "key aiops:run:{r-42}:call:c-7 here"),
            "key [redis key] here"
        );
        assert_eq!(
            masked(&ids, "\"aiops:release:{r}\",'aiops:run:x'"),
            "\"[redis key]\",'[redis key]'"
        );
        assert_eq!(masked(&ids, "xaiops:run:y"), "x[redis key]");
        assert_eq!(
            masked(&ids, "c-1aiops:run:y"),
            "[call id][redis key]",
            "next to a masked key, a call id stands alone"
        );
        for other in ["aiops:cancel", "other:run:{r}", "aiops:runs", "AIOPS:run:x"] {
            assert_eq!(masked(&ids, other), other);
        }
    }

    #[test]
    fn a_call_id_ending_a_text_is_found_for_a_cut() {
        let ids = ids();
        assert_eq!(ids.call_id_at_end("see c-1"), Some(3));
        assert_eq!(ids.call_id_at_end("c-1"), Some(3));
        assert_eq!(ids.call_id_at_end("xc-1"), None);
        assert_eq!(ids.call_id_at_end("c-1 "), None);
    }

    #[test]
    fn the_runs_ids_are_its_calls_and_cited_ids_with_records() {
        let mut evidence = run_evidence();
        evidence.records.insert(
            "c-stray".into(),
            crate::domain::invocation::tests::log_found("other", "c-stray"),
        );
        let run = evidence.resolve(&["c-stray".into(), "c-ghost".into(), " ".into()]);
        let ids = RunIdentifiers::of_run(&run, "aiops");
        for id in ["c-log", "c-sql", "c-rag", "c-stray"] {
            assert!(ids.is_call_id(id), "{id}");
        }
        assert!(
            !ids.is_call_id("c-ghost"),
            "a fabricated id is not the run's"
        );
        assert!(!ids.is_call_id(" "));
    }

    #[test]
    fn a_draft_naming_a_call_id_or_key_breaks_the_rule_in_each_field() {
        let run = run_evidence().resolve(&good_draft().cited_call_ids());
        let ids = RunIdentifiers::of_run(&run, "aiops");
        assert_eq!(draft_names_identifier(&good_draft(), &ids), vec![]);
        let mut draft = good_draft();
        draft.conclusion.as_mut().unwrap().text = "See c-log.".into();
        draft.analyses[1].text = "Read aiops:run:{r}:call:c-sql".into();
        draft.analyses[0].id = "c-rag".into();
        draft.limitations = vec!["c-logs are fine".into(), "x c-sql".into()];
        draft.missing_context = vec!["aiops:release:{r}".into()];
        let violations = draft_names_identifier(&draft, &ids);
        let got: Vec<_> = violations
            .iter()
            .map(|v| (v.at.as_str(), v.tool_call_id.as_deref()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("conclusion", Some("c-log")),
                ("analyses[0]", Some("c-rag")),
                ("analyses[1]", None),
                ("limitations[1]", Some("c-sql")),
                ("missing_context[0]", None),
            ]
        );
        for v in &violations {
            assert_eq!(v.rule, Rule::DraftNamesIdentifier);
            assert!(
                !v.detail.contains("aiops") && !v.detail.contains("See"),
                "{}",
                v.detail
            );
        }
    }

    /// Invisible controls (the ones the judge's request drops) and fullwidth forms inside
    /// an id or key do not hide it: the Draft breaks the rule, and a copy is masked.
    #[test]
    fn ids_and_keys_are_found_as_people_read_them() {
        let run = run_evidence().resolve(&good_draft().cited_call_ids());
        let ids = RunIdentifiers::of_run(&run, "aiops");
        for hidden in [
            "See c\u{200B}-log.",
            "See c-\u{00AD}log.",
            "See c-l\u{2060}og.",
            "See \u{FEFF}c-log.",
            "See ｃ－ｌｏｇ.",
            "Read aiops:\u{200B}run:{r}:calls",
            "Read aiops\u{00AD}:run:{r}:calls",
            "Read aiops:run\u{2060}:{r}:calls",
            "Read \u{FEFF}aiops:release:{r}",
        ] {
            let mut draft = good_draft();
            draft.conclusion.as_mut().unwrap().text = hidden.into();
            let violations = draft_names_identifier(&draft, &ids);
            assert_eq!(violations.len(), 1, "{hidden:?}");
            assert_eq!(violations[0].rule, Rule::DraftNamesIdentifier);
            assert!(!ids.mask(hidden).contains("c-log"), "{hidden:?}");
            assert!(!ids.mask(hidden).contains("aiops:"), "{hidden:?}");
        }
        assert_eq!(ids.mask("x c\u{200B}-log y"), "x [call id] y");
        assert_eq!(ids.mask("x c\u{200B}-logs y"), "x c-logs y");
        // NFKC folds only where it reveals an identifier: an ellipsis stays one.
        assert_eq!(ids.mask("wait… ｃ－ｌｏｇ"), "wait... [call id]");
        assert_eq!(ids.mask("wait… ok"), "wait… ok");
    }
}
