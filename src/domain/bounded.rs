//! What the harness copies from the agent's records into results and into the verified
//! snapshot: every string masked (the run's call ids and Redis keys, see
//! [`super::identifiers`]) and then cut to a bounded JSON size with a visible marker;
//! scopes bounded in entries and depth (CONTRACT §1, config `evidence.*`). The same input
//! always gives the same output.
//!
//! Entry points: [`Redactor::text`], [`Redactor::excerpt`], [`Redactor::cell`],
//! [`Redactor::scope`] and [`json_len`].

use std::borrow::Cow;

use serde::Serialize;
use serde_json::{Map, Value};

use super::identifiers::{Piece, RunIdentifiers};
use super::json;
use super::scope::Scope;

/// The end of every string that was cut.
pub const TRUNCATED: &str = "…[truncated]";
/// What stands for entries or nesting left out of a scope.
pub const ELIDED: &str = "…";
/// A string that, even masked, would still show an identifier (only with call ids that
/// end in punctuation or equal a word of a mask); it is replaced whole.
pub const MASKED: &str = "[masked]";
/// Nesting levels kept of a scope: the scope is level 1 (its `params` level 2); an array
/// or object at this level or deeper becomes [`ELIDED`].
pub const MAX_SCOPE_DEPTH: usize = 4;

/// Limits on what is copied from records (config `evidence.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyLimits {
    /// Longest copied string, in bytes of its JSON-escaped form (without quotes), before
    /// [`TRUNCATED`] is appended.
    pub max_string_bytes: usize,
    /// Entries kept of one array or object inside a scope.
    pub max_scope_items: usize,
    /// Largest JSON size of `verified_sources`, and of `observed_facts`, of one result.
    pub max_written_bytes: usize,
}

impl Default for CopyLimits {
    fn default() -> Self {
        CopyLimits {
            max_string_bytes: 256,
            max_scope_items: 8,
            max_written_bytes: 98304,
        }
    }
}

/// Bytes of `c` inside a JSON string as serde_json writes it.
pub fn escaped_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{08}' | '\u{0c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// Bytes of `value` as compact JSON.
pub fn json_len<T: Serialize + ?Sized>(value: &T) -> usize {
    /// Counts what is written, keeping none of it.
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

/// At least [`json_len`] of `text` as a JSON string, from its length alone: no byte
/// escapes to more than six.
pub fn str_json_len_bound(text: &str) -> usize {
    text.len().saturating_mul(6).saturating_add(2)
}

/// At least [`json_len`] of `value`, from lengths alone (no escaping, no number
/// formatting): enough to tell, without writing anything, that a value is far within a
/// limit.
pub fn json_len_bound(value: &Value) -> usize {
    /// A number written by serde_json: at most 20 characters for an integer, 24 for a
    /// float (shortest round-trip form); non-finite floats are `null`.
    const NUMBER: usize = 32;
    match value {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(_) => NUMBER,
        Value::String(s) => str_json_len_bound(s),
        // Brackets, and a comma after every item (one more than written).
        Value::Array(items) => items.iter().fold(2usize, |size, item| {
            size.saturating_add(json_len_bound(item)).saturating_add(1)
        }),
        Value::Object(entries) => {
            object_len_bound(entries.iter().map(|(key, item)| (key.as_str(), item)))
        }
    }
}

/// [`json_len_bound`] of an object with these entries.
pub fn object_len_bound<'a>(entries: impl Iterator<Item = (&'a str, &'a Value)>) -> usize {
    // Braces, and per entry its key, a colon and a comma.
    entries.fold(2usize, |size, (key, item)| {
        size.saturating_add(str_json_len_bound(key))
            .saturating_add(json_len_bound(item))
            .saturating_add(2)
    })
}

/// Masks and bounds strings copied from one run's records.
#[derive(Debug, Clone, Copy)]
pub struct Redactor<'a> {
    pub ids: &'a RunIdentifiers,
    pub limits: CopyLimits,
}

impl<'a> Redactor<'a> {
    pub fn new(ids: &'a RunIdentifiers, limits: CopyLimits) -> Redactor<'a> {
        Redactor { ids, limits }
    }

    /// A string copied from a record: masked, then cut to `max_string_bytes`.
    pub fn text(&self, text: &str) -> String {
        self.cut(text, usize::MAX, self.limits.max_string_bytes).0
    }

    /// An excerpt, log message or cell of the snapshot: masked, then cut to `max_chars`
    /// characters and `max_bytes` bytes of its JSON-escaped form (the snapshot's own excerpt
    /// limits, not `max_string_bytes`: the judge must see enough of the evidence). Says
    /// whether it was cut.
    pub fn excerpt(&self, text: &str, max_chars: usize, max_bytes: usize) -> (String, bool) {
        self.cut(text, max_chars, max_bytes)
    }

    /// A MySQL cell: strings as excerpts, arrays and objects as their bounded JSON text.
    pub fn cell(&self, cell: &Value, max_chars: usize, max_bytes: usize) -> Value {
        match cell {
            Value::String(s) => Value::String(self.excerpt(s, max_chars, max_bytes).0),
            Value::Array(_) | Value::Object(_) => {
                Value::String(self.excerpt(&cell.to_string(), max_chars, max_bytes).0)
            }
            other => other.clone(),
        }
    }

    /// A projection's scope: keys and strings as [`Redactor::text`], every array or object
    /// below the scope itself cut to its first `max_scope_items` entries (objects in their
    /// written order) plus a last entry saying how many were left out (`"… N more"` in an
    /// array, `"…": "N more"` in an object), and nothing nested deeper than
    /// [`MAX_SCOPE_DEPTH`] levels.
    pub fn scope(&self, scope: &Value) -> Value {
        // Most scopes need no change: checked without writing anything, then copied.
        if self.scope_unchanged(scope, 1) {
            return scope.clone();
        }
        self.scope_value(scope, 1)
    }

    /// [`Redactor::scope`] of a shared scope: the scope itself when bounding leaves it
    /// unchanged (most scopes), else its bounded copy.
    pub fn shared_scope(&self, scope: &Scope) -> Scope {
        if self.entries_unchanged(scope.entries(), 1) {
            return scope.clone();
        }
        Scope::of(self.scope_value(&scope.to_value(), 1))
    }

    /// Whether [`Redactor::scope_value`] gives `value` back as it is: no string or key is
    /// masked or cut, no array or object is cut or too deep, no key is [`ELIDED`].
    fn scope_unchanged(&self, value: &Value, level: usize) -> bool {
        let keep = self.items_kept(level);
        match value {
            Value::String(s) => self.text_unchanged(s),
            Value::Array(_) | Value::Object(_) if level >= MAX_SCOPE_DEPTH => false,
            Value::Array(items) => {
                items.len() <= keep && items.iter().all(|i| self.scope_unchanged(i, level + 1))
            }
            Value::Object(entries) => self.entries_unchanged(
                entries.iter().map(|(key, item)| (key.as_str(), item)),
                level,
            ),
            _ => true,
        }
    }

    /// [`Redactor::scope_unchanged`] of an object at `level` with these entries.
    fn entries_unchanged<'e>(
        &self,
        mut entries: impl ExactSizeIterator<Item = (&'e str, &'e Value)>,
        level: usize,
    ) -> bool {
        entries.len() <= self.items_kept(level)
            && entries.all(|(key, item)| {
                key != ELIDED && self.text_unchanged(key) && self.scope_unchanged(item, level + 1)
            })
    }

    /// Whether [`Redactor::text`] gives `text` back as it is: nothing in it to mask, and
    /// its escaped form within `max_string_bytes`.
    fn text_unchanged(&self, text: &str) -> bool {
        // A text with invisible controls (or an identifier only NFKC shows) is copied as
        // shown.
        if !text.is_ascii() && matches!(self.ids.shown(text), Cow::Owned(_)) {
            return false;
        }
        let max = self.limits.max_string_bytes;
        // Most texts escape nothing: their escaped length is their length.
        if text.len() <= max && json::escapes_nothing(text.as_bytes()) {
            return self.ids.first_in(text).is_none();
        }
        let mut bytes = 0usize;
        for b in text.bytes() {
            // Per byte as serde_json escapes it; a multi-byte character counts its bytes.
            bytes += match b {
                b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
                0..=0x1f => 6,
                _ => 1,
            };
            if bytes > max {
                return false;
            }
        }
        self.ids.first_in(text).is_none()
    }

    /// Entries kept of an array or object at `level` of a scope. The scope's own keys are
    /// the projection's fixed fields: only what is below them is cut by count.
    fn items_kept(&self, level: usize) -> usize {
        if level == 1 {
            usize::MAX
        } else {
            self.limits.max_scope_items
        }
    }

    fn scope_value(&self, value: &Value, level: usize) -> Value {
        let keep = self.items_kept(level);
        match value {
            Value::String(s) => Value::String(self.text(s)),
            Value::Array(_) | Value::Object(_) if level >= MAX_SCOPE_DEPTH => {
                Value::String(ELIDED.into())
            }
            Value::Array(items) => {
                let mut out: Vec<Value> = items
                    .iter()
                    .take(keep)
                    .map(|item| self.scope_value(item, level + 1))
                    .collect();
                let left_out = items.len().saturating_sub(keep);
                if left_out > 0 {
                    out.push(Value::String(format!("{ELIDED} {left_out} more")));
                }
                Value::Array(out)
            }
            Value::Object(entries) => {
                let mut out = Map::new();
                let mut left_out = 0usize;
                for (key, item) in entries {
                    if out.len() >= keep {
                        left_out += 1;
                        continue;
                    }
                    let key = self.text(key);
                    // Two keys can read the same once masked or cut; the marker's key is
                    // reserved. Either way the entry counts as left out, never overwritten.
                    if key == ELIDED || out.contains_key(&key) {
                        left_out += 1;
                        continue;
                    }
                    out.insert(key, self.scope_value(item, level + 1));
                }
                if left_out > 0 {
                    out.insert(ELIDED.into(), Value::String(format!("{left_out} more")));
                }
                Value::Object(out)
            }
            other => other.clone(),
        }
    }

    /// [`Redactor::text`] appended to `out`: the same characters, without a `String` of
    /// its own.
    pub fn push_text(&self, out: &mut String, text: &str) {
        self.cut_into(out, text, usize::MAX, self.limits.max_string_bytes);
    }

    /// Masks `text`, keeps at most `max_chars` characters and `max_bytes` escaped bytes of
    /// the masked text, and marks a cut with [`TRUNCATED`].
    fn cut(&self, text: &str, max_chars: usize, max_bytes: usize) -> (String, bool) {
        // Sized for the copy of an unmasked, uncut text: it grows only for a longer mask.
        let mut out = String::with_capacity(text.len().min(max_bytes));
        let cut = self.cut_into(&mut out, text, max_chars, max_bytes);
        (out, cut)
    }

    /// [`Redactor::cut`] appended to `out` (what was in `out` before is left as it is and
    /// plays no part); says whether the copy was cut or replaced.
    fn cut_into(&self, out: &mut String, text: &str, max_chars: usize, max_bytes: usize) -> bool {
        // Identifiers are masked in the text as people read it, which is what is copied.
        let text = self.ids.shown(text);
        let text = text.as_ref();
        let start = out.len();
        let (mut bytes, mut chars, mut cut, mut masked) = (0usize, 0usize, false, false);
        'pieces: for piece in self.ids.pieces(text) {
            masked |= !matches!(piece, Piece::Text(_));
            let shown = piece.masked();
            // Plain ASCII (nothing JSON escapes): one byte per character, taken whole when
            // it fits.
            if shown.len() <= max_bytes - bytes
                && shown.len() <= max_chars.saturating_sub(chars)
                && shown.is_ascii()
                && json::escapes_nothing(shown.as_bytes())
            {
                out.push_str(shown);
                bytes += shown.len();
                chars += shown.len();
                continue;
            }
            for c in shown.chars() {
                let width = escaped_len(c);
                if chars == max_chars || bytes + width > max_bytes {
                    cut = true;
                    break 'pieces;
                }
                out.push(c);
                bytes += width;
                chars += 1;
            }
        }
        if cut {
            // `c-1` cut out of `c-10` would read as the call id `c-1`: cut before it.
            while let Some(len) = self.ids.call_id_at_end(&out[start..]) {
                out.truncate(out.len() - len);
            }
            out.push_str(TRUNCATED);
        }
        // Untouched, the copy is the text, in which `pieces` found no identifier; only a
        // mask or a cut can have written one (e.g. `x.` before a mask, a cut after `c-1`).
        if (masked || cut) && self.ids.first_in(&out[start..]).is_some() {
            out.truncate(start);
            out.push_str(MASKED);
            return true;
        }
        cut
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn ids() -> RunIdentifiers {
        RunIdentifiers::new(["c-1", "call-log-01"], "aiops")
    }

    fn redactor(ids: &RunIdentifiers) -> Redactor<'_> {
        Redactor::new(ids, CopyLimits::default())
    }

    #[test]
    fn short_strings_are_copied_with_identifiers_masked() {
        let ids = ids();
        let r = redactor(&ids);
        assert_eq!(r.text("order-api"), "order-api");
        assert_eq!(
            r.text("after call-log-01 read aiops:run:{r}:call:c-1"),
            "after [call id] read [redis key]"
        );
    }

    #[test]
    fn long_strings_are_cut_at_a_char_boundary_with_a_marker_the_same_way_every_time() {
        let ids = ids();
        let r = redactor(&ids);
        let long = "é".repeat(1000);
        let cut = r.text(&long);
        assert_eq!(cut, format!("{}{TRUNCATED}", "é".repeat(128)));
        assert_eq!(r.text(&long), cut, "deterministic");
        let exact = "x".repeat(256);
        assert_eq!(r.text(&exact), exact, "exactly at the limit is not cut");
        assert_eq!(
            r.text(&"x".repeat(257)),
            format!("{}{TRUNCATED}", "x".repeat(256))
        );
    }

    #[test]
    fn the_limit_counts_json_escapes() {
        let ids = ids();
        let r = redactor(&ids);
        let controls = "\u{1}".repeat(1000);
        let cut = r.text(&controls);
        assert_eq!(
            cut,
            format!("{}{TRUNCATED}", "\u{1}".repeat(42)),
            "6 bytes each"
        );
        let quotes = r.text(&"\"".repeat(1000));
        assert_eq!(quotes.chars().filter(|c| *c == '"').count(), 128);
        for s in [cut, quotes] {
            let json = serde_json::to_string(&s).unwrap();
            assert!(json.len() - 2 <= 256 + TRUNCATED.len(), "{}", json.len());
        }
    }

    #[test]
    fn masking_happens_before_the_cut() {
        let ids = ids();
        let r = redactor(&ids);
        // The key reaches far past the cut: masked, it is short and nothing is cut.
        let key = format!("aiops:run:{{r}}:{}", "k".repeat(5000));
        assert_eq!(r.text(&key), "[redis key]");
        let text = format!("{} call-log-01", "x".repeat(250));
        assert_eq!(
            r.text(&text),
            format!("{} [call{TRUNCATED}", "x".repeat(250))
        );
    }

    #[test]
    fn a_cut_never_leaves_a_call_id_at_its_end() {
        let ids = ids();
        let r = redactor(&ids);
        let text = format!("{} c-10", "x".repeat(252));
        assert_eq!(r.text(&text), format!("{} {TRUNCATED}", "x".repeat(252)));
        let (excerpt, cut) = r.excerpt("see c-10", 7, 256);
        assert_eq!(excerpt, format!("see {TRUNCATED}"));
        assert!(cut);
    }

    #[test]
    fn excerpts_are_cut_by_characters_too() {
        let ids = ids();
        let r = redactor(&ids);
        assert_eq!(
            r.excerpt("abcdef", 3, 256),
            (format!("abc{TRUNCATED}"), true)
        );
        assert_eq!(r.excerpt("abc", 3, 256), ("abc".to_string(), false));
    }

    #[test]
    fn excerpts_have_their_own_byte_limit_not_the_record_string_cap() {
        let ids = ids();
        let r = redactor(&ids);
        assert_eq!(r.limits.max_string_bytes, 256);
        let long = "x".repeat(1000);
        assert_eq!(r.excerpt(&long, 4096, 4096), (long.clone(), false));
        assert_eq!(
            r.excerpt(&long, 4096, 100),
            (format!("{}{TRUNCATED}", "x".repeat(100)), true)
        );
        // Escapes count against the excerpt's byte limit too.
        let quotes = "\"".repeat(1000);
        let (cut, was_cut) = r.excerpt(&quotes, 4096, 1000);
        assert!(was_cut);
        assert_eq!(cut.chars().filter(|c| *c == '"').count(), 500);
        // A record string stays within the cap.
        assert_eq!(r.text(&long), format!("{}{TRUNCATED}", "x".repeat(256)));
    }

    #[test]
    fn a_string_that_would_still_show_an_identifier_is_replaced_whole() {
        // `x.` ends in punctuation: before the masked `c-1` it stands alone.
        let ids = RunIdentifiers::new(["x.", "c-1"], "aiops");
        let r = redactor(&ids);
        assert_eq!(r.text("x.c-1"), MASKED);
    }

    #[test]
    fn scopes_keep_their_first_entries_and_bounded_depth() {
        let ids = ids();
        let r = Redactor::new(
            &ids,
            CopyLimits {
                max_scope_items: 2,
                ..CopyLimits::default()
            },
        );
        let scope = json!({
            "datasource": "orders-db", "statement": "s", "max_rows": 5, "from": "a", "to": "b",
            "params": {"z": 1, "a": [1, 2, 3, 4], "m": 3, "q": 4},
            "deep": {"l2": {"l3": {"l4": 1}, "s": "x"}},
        });
        let bounded = r.scope(&scope);
        assert_eq!(
            bounded,
            json!({
                "datasource": "orders-db", "statement": "s", "max_rows": 5, "from": "a", "to": "b",
                "params": {"z": 1, "a": [1, 2, "… 2 more"], "…": "2 more"},
                "deep": {"l2": {"l3": "…", "s": "x"}},
            })
        );
        let keys: Vec<_> = bounded["params"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(keys, ["z", "a", "…"], "written order is kept");
        assert_eq!(r.scope(&scope), bounded, "deterministic");
    }

    #[test]
    fn scope_keys_and_values_are_masked_and_never_collide() {
        let ids = ids();
        let r = redactor(&ids);
        let scope = json!({"query": "c-1 OR call-log-01", "params": {
            "aiops:run:{a}": 1, "aiops:run:{b}": 2, "…": 3, "k": "aiops:release:{r}"}});
        assert_eq!(
            r.scope(&scope),
            json!({"query": "[call id] OR [call id]", "params": {
                "[redis key]": 1, "k": "[redis key]", "…": "2 more"}})
        );
    }

    #[test]
    fn a_maximal_scope_stays_small_with_the_defaults() {
        // Every string 1000 control characters (6 bytes each once escaped), every container
        // as full as a record could make it, nested deeper than kept.
        let ids = ids();
        let r = redactor(&ids);
        let s = || Value::String("\u{1}".repeat(1000));
        let key = |i: usize| format!("{i}{}", "\u{2}".repeat(999));
        let level3 = Value::Object((0..9).map(|i| (key(i), s())).collect());
        let level2 = Value::Object((0..9).map(|i| (key(i), level3.clone())).collect());
        let scope = json!({"datasource": s(), "statement": s(), "from": s(), "to": s(),
                           "max_rows": 1, "params": level2});
        let size = json_len(&r.scope(&scope));
        assert!(size < 48 * 1024, "one scope is {size} bytes");
    }

    /// Scopes of any shape: strings near the limit, with identifiers, escapes, the marker
    /// key; containers around the item limit and the depth limit.
    pub(crate) fn scope_strategy() -> impl Strategy<Value = Value> {
        let text = prop_oneof![
            "[a-z :.-]{0,8}",
            "[\"\\\\\n\u{1}é]{0,4}",
            Just("c-1".to_string()),
            Just("x c-1 y".to_string()),
            Just("c-10".to_string()),
            Just("aiops:run:{r}:call:c-1".to_string()),
            Just(ELIDED.to_string()),
            (250usize..260).prop_map(|n| "x".repeat(n)),
            (125usize..131).prop_map(|n| "é".repeat(n)),
            (40usize..45).prop_map(|n| "\u{1}".repeat(n)),
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            Just(Value::from(f64::MIN_POSITIVE)),
            Just(Value::from(-2.2250738585072014e-308)),
            any::<f64>().prop_map(Value::from),
            text.clone().prop_map(Value::String),
        ];
        leaf.prop_recursive(5, 64, 10, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..10).prop_map(Value::Array),
                prop::collection::vec((text.clone(), inner), 0..10)
                    .prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// The copy of an unchanged scope is what bounding it entry by entry writes.
        #[test]
        fn a_scope_is_copied_only_when_bounding_would_not_change_it(scope in scope_strategy()) {
            let ids = ids();
            let r = redactor(&ids);
            prop_assert_eq!(r.scope(&scope), r.scope_value(&scope, 1));
            prop_assert_eq!(r.scope_unchanged(&scope, 1), r.scope_value(&scope, 1) == scope);
        }

        /// A shared scope is bounded as its JSON object is: the same entries in the same
        /// order, and the very same entries when nothing changes.
        #[test]
        fn a_shared_scope_is_bounded_as_its_object(scope in scope_strategy()) {
            let ids = ids();
            let r = redactor(&ids);
            let object = match scope {
                Value::Object(_) => scope,
                other => json!({"params": other, "query": "c-1 q"}),
            };
            let shared = Scope::of(object.clone());
            let bounded = r.shared_scope(&shared);
            prop_assert_eq!(json_len(&bounded), json_len(&r.scope(&object)));
            prop_assert_eq!(
                serde_json::to_string(&bounded).unwrap(),
                serde_json::to_string(&r.scope(&object)).unwrap()
            );
            prop_assert_eq!(Scope::ptr_eq(&bounded, &shared), r.scope(&object) == object);
            prop_assert!(shared.json_len_bound() >= json_len(&shared));
        }

        /// The bound from lengths is never below the size written.
        #[test]
        fn the_length_bound_is_never_below_the_json_size(value in scope_strategy()) {
            prop_assert!(json_len_bound(&value) >= json_len(&value));
            if let Value::String(s) = &value {
                prop_assert!(str_json_len_bound(s) >= json_len(s));
            }
        }
    }
}
