//! Text as people read it: what EvidenceGuard compares identifiers against and what the
//! masking works on, so that what the judge is sent is exactly what was checked.
//!
//! Entry points: [`as_read`] (a text without the invisible controls the judge's request
//! drops, NFKC-normalised when it holds anything NFKC changes), [`visible`] (without the
//! invisible controls only) and [`invisible_len`] (the one list of those controls, which the
//! request writer drops too).

use std::borrow::Cow;

use unicode_normalization::{is_nfkc_quick, IsNormalized, UnicodeNormalization};

/// The length of the invisible control character (U+00AD, U+061C, U+180E, U+200B–U+200F,
/// U+202A–U+202E, U+2060–U+2064, U+2066–U+2069, U+FEFF) encoded at the start of `bytes`,
/// or 0 if none starts there.
pub fn invisible_len(bytes: &[u8]) -> usize {
    match bytes {
        [0xC2, 0xAD, ..] | [0xD8, 0x9C, ..] => 2,
        [0xE1, 0xA0, 0x8E, ..]
        | [0xE2, 0x80, 0x8B..=0x8F, ..]
        | [0xE2, 0x80, 0xAA..=0xAE, ..]
        | [0xE2, 0x81, 0xA0..=0xA4, ..]
        | [0xE2, 0x81, 0xA6..=0xA9, ..]
        | [0xEF, 0xBB, 0xBF, ..] => 3,
        _ => 0,
    }
}

/// `text` as a person reads it: the invisible controls ([`invisible_len`]) dropped, then
/// NFKC (fullwidth `ｃ－７` reads as `c-7`, `ﬁ` as `fi`) when that changes anything.
/// Borrowed when nothing changes, as for every ASCII text.
pub fn as_read(text: &str) -> Cow<'_, str> {
    if text.is_ascii() {
        return Cow::Borrowed(text);
    }
    let visible = visible(text);
    match is_nfkc_quick(visible.chars()) {
        IsNormalized::Yes => visible,
        IsNormalized::No | IsNormalized::Maybe => {
            let normalized: String = visible.nfkc().collect();
            if normalized == *visible {
                visible
            } else {
                Cow::Owned(normalized)
            }
        }
    }
}

/// `text` without its invisible controls ([`invisible_len`]), as the judge's request
/// shows it; borrowed when it has none.
pub fn visible(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let mut out = String::new();
    let (mut start, mut i) = (0, 0);
    while i < bytes.len() {
        let skip = invisible_len(&bytes[i..]);
        if skip > 0 {
            out.push_str(&text[start..i]);
            i += skip;
            start = i;
        } else {
            i += 1;
        }
    }
    if start == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[start..]);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invisible_controls_are_dropped_and_compatibility_forms_folded() {
        for (text, read) in [
            ("c\u{200B}-7", "c-7"),
            ("c\u{00AD}-7", "c-7"),
            ("c-\u{2060}7", "c-7"),
            ("\u{FEFF}c-7", "c-7"),
            ("aiops:\u{200B}run:{r}:calls", "aiops:run:{r}:calls"),
            ("ｃ－７", "c-7"),
            ("c-7", "c-7"),
            ("é – ok", "é – ok"),
        ] {
            assert_eq!(as_read(text), read, "{text:?}");
        }
        assert!(matches!(as_read("plain"), Cow::Borrowed(_)));
        assert!(matches!(as_read("é – ok"), Cow::Borrowed(_)));
    }
}
