//! Writing a chat-completions body straight into its final bytes.
//!
//! A JSON string is escaped as it is written, and a value that travels inside a string
//! (the Draft and the evidence, serialized as JSON inside the user message) is serialized
//! by [`push_json`] with a formatter that writes it already escaped for the string: no
//! intermediate `String` or `Value` is built, and nothing is scanned twice over.
//! Invisible control characters (zero-width, bidirectional) can be dropped on the way.

use std::io;

use crate::domain::json;

/// How each byte is written inside a JSON string: 0 = as it is, `u` = `\u00XX`, otherwise
/// a backslash and this letter. Bytes ≥ 0x80 (UTF-8 sequences) are written as they are.
static ESCAPE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = b'u';
        b += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0A] = b'n';
    table[0x0C] = b'f';
    table[0x0D] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

/// First bytes of the UTF-8 encodings of the invisible controls ([`invisible_len`]).
static INVISIBLE_LEAD: [bool; 256] = {
    let mut table = [false; 256];
    table[0xC2] = true;
    table[0xD8] = true;
    table[0xE1] = true;
    table[0xE2] = true;
    table[0xEF] = true;
    table
};

/// Bytes that need a closer look: escaped ones, and (when stripping) the first bytes of the
/// invisible controls.
static SPECIAL: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = ESCAPE[b] != 0;
        b += 1;
    }
    table
};
static SPECIAL_STRIP: [bool; 256] = {
    let mut table = SPECIAL;
    let mut b = 0;
    while b < 256 {
        table[b] = table[b] || INVISIBLE_LEAD[b];
        b += 1;
    }
    table
};

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The invisible controls' lengths: one rule for the judge's request and EvidenceGuard's
/// identifier check ([`crate::domain::text`]).
pub use crate::domain::text::invisible_len;

/// Appends `bytes` (UTF-8 text) to `out` as the contents of a JSON string, dropping the
/// invisible controls when `strip` is set.
pub fn push_escaped(out: &mut Vec<u8>, bytes: &[u8], strip: bool) {
    out.reserve(bytes.len());
    // Writing into a Vec cannot fail.
    let _ = write_escaped(out, bytes, strip, Depth::Once);
}

/// How many times text is escaped: once for a JSON string, or twice for a JSON string
/// holding JSON text whose strings hold it ([`push_json`]: `"` becomes `\"`, then `\\\"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Depth {
    Once,
    Twice,
}

/// [`push_escaped`] into any writer, escaped once or twice.
fn write_escaped<W: ?Sized + io::Write>(
    out: &mut W,
    bytes: &[u8],
    strip: bool,
    depth: Depth,
) -> io::Result<()> {
    let special = if strip { &SPECIAL_STRIP } else { &SPECIAL };
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        // Most bytes are written as they are: eight at a time up to the first special
        // byte, which the word test points at; the last few bytes one lookup each.
        while let Some(chunk) = bytes.get(i..i + 8) {
            let special = json::special_bytes(chunk, strip);
            if special != 0 {
                i += (special.trailing_zeros() / 8) as usize;
                break;
            }
            i += 8;
        }
        if bytes.len() - i < 8 {
            while i < bytes.len() && !special[bytes[i] as usize] {
                i += 1;
            }
        }
        if i == bytes.len() {
            break;
        }
        let b = bytes[i];
        let escape = ESCAPE[b as usize];
        if escape != 0 {
            out.write_all(&bytes[start..i])?;
            write_escape(out, b, escape, depth)?;
            i += 1;
            start = i;
        } else if strip && INVISIBLE_LEAD[b as usize] {
            let skip = invisible_len(&bytes[i..]);
            if skip > 0 {
                out.write_all(&bytes[start..i])?;
                i += skip;
                start = i;
            } else {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out.write_all(&bytes[start..])
}

/// The escape of byte `b` (its [`ESCAPE`] entry `escape`), once (`\n`, `\u001f`) or with
/// its backslash, and any quote, escaped once more (`\\n`, `\\u001f`, `\\\"`).
fn write_escape<W: ?Sized + io::Write>(
    out: &mut W,
    b: u8,
    escape: u8,
    depth: Depth,
) -> io::Result<()> {
    let (high, low) = (HEX[(b >> 4) as usize], HEX[(b & 0xF) as usize]);
    match (depth, escape) {
        (Depth::Once, b'u') => out.write_all(&[b'\\', b'u', b'0', b'0', high, low]),
        (Depth::Once, _) => out.write_all(&[b'\\', escape]),
        (Depth::Twice, b'u') => out.write_all(&[b'\\', b'\\', b'u', b'0', b'0', high, low]),
        (Depth::Twice, b'"') => out.write_all(b"\\\\\\\""),
        (Depth::Twice, b'\\') => out.write_all(b"\\\\\\\\"),
        (Depth::Twice, _) => out.write_all(&[b'\\', b'\\', escape]),
    }
}

/// Appends `text` as a whole JSON string (quotes included).
pub fn push_string(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    push_escaped(out, text.as_bytes(), false);
    out.push(b'"');
}

/// Serializes `value` as JSON into the inside of a JSON string in one pass: a
/// [`Formatter`](sonic_rs::format::Formatter) writes the value's structure already escaped
/// (`{`, `:` and digits need nothing; a quote is written `\"`), and each string's text
/// escaped twice as it is written (nothing scans it before). Invisible controls inside
/// strings are dropped when `strip_invisible` is set.
pub fn push_json<T: serde::Serialize + ?Sized>(
    out: &mut Vec<u8>,
    value: &T,
    strip_invisible: bool,
) -> Result<(), crate::domain::json::JsonError> {
    let mut serializer = sonic_rs::Serializer::with_formatter(out, InString { strip_invisible });
    value.serialize(&mut serializer)
}

/// The formatter of [`push_json`]: compact JSON, escaped for the inside of a string.
#[derive(Clone)]
struct InString {
    strip_invisible: bool,
}

impl sonic_rs::format::Formatter for InString {
    fn write_string_fast<W: ?Sized + sonic_rs::writer::WriteExt>(
        &mut self,
        writer: &mut W,
        value: &str,
        need_quote: bool,
    ) -> io::Result<()> {
        if need_quote {
            writer.write_all(b"\\\"")?;
        }
        write_escaped(writer, value.as_bytes(), self.strip_invisible, Depth::Twice)?;
        if need_quote {
            writer.write_all(b"\\\"")?;
        }
        Ok(())
    }

    fn begin_string<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(b"\\\"")
    }

    fn end_string<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(b"\\\"")
    }

    fn write_raw_value<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        raw: &str,
    ) -> io::Result<()> {
        write_escaped(writer, raw.as_bytes(), false, Depth::Once)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn escaped(text: &str, strip: bool) -> String {
        let mut out = Vec::new();
        push_escaped(&mut out, text.as_bytes(), strip);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn escapes_as_json_does() {
        let text = "a\"b\\c\n\t\r\u{8}\u{c}\u{1}\u{1f}é–😀";
        assert_eq!(
            format!("\"{}\"", escaped(text, false)),
            serde_json::to_string(text).unwrap()
        );
    }

    #[test]
    fn drops_every_invisible_control_and_nothing_else() {
        let invisible: Vec<char> = (0u32..0x11000)
            .filter_map(char::from_u32)
            .filter(|c| {
                let mut b = [0u8; 4];
                invisible_len(c.encode_utf8(&mut b).as_bytes()) > 0
            })
            .collect();
        let expected: Vec<char> = ['\u{00AD}', '\u{061C}', '\u{180E}']
            .into_iter()
            .chain('\u{200B}'..='\u{200F}')
            .chain('\u{202A}'..='\u{202E}')
            .chain('\u{2060}'..='\u{2064}')
            .chain('\u{2066}'..='\u{2069}')
            .chain(['\u{FEFF}'])
            .collect();
        assert_eq!(invisible, expected);
        assert_eq!(
            escaped("a\u{200B}b\u{202E}c\u{FEFF}d\u{2066}", true),
            "abcd"
        );
        assert_eq!(escaped("a\u{200B}b", false), "a\u{200B}b");
    }

    proptest! {
        #[test]
        fn escaped_text_reads_back_as_the_text(text in any::<String>()) {
            let json = format!("\"{}\"", escaped(&text, false));
            prop_assert_eq!(serde_json::from_str::<String>(&json).unwrap(), text.clone());
            let stripped = format!("\"{}\"", escaped(&text, true));
            let expected: String = text.chars().filter(|c| {
                let mut b = [0u8; 4];
                invisible_len(c.encode_utf8(&mut b).as_bytes()) == 0
            }).collect();
            prop_assert_eq!(serde_json::from_str::<String>(&stripped).unwrap(), expected);
        }

        /// One pass writes what serializing and then escaping the JSON text writes.
        #[test]
        fn a_value_in_a_string_is_its_json_escaped(
            value in crate::domain::json::tests::json_value(),
            strip in any::<bool>(),
        ) {
            let mut one_pass = Vec::new();
            push_json(&mut one_pass, &value, strip).unwrap();
            let mut two_passes = Vec::new();
            push_escaped(&mut two_passes, serde_json::to_string(&value).unwrap().as_bytes(), strip);
            prop_assert_eq!(String::from_utf8(one_pass).unwrap(), String::from_utf8(two_passes).unwrap());
        }

        /// Mostly plain ASCII with the odd special byte at any offset: the eight-byte skip
        /// must never step over one.
        #[test]
        fn the_word_skip_never_steps_over_a_special_byte(
            text in "[ -~]{0,40}[\"\\\\\n\t\u{1}\u{1f}\u{7f}\u{200B}é]?[ -~]{0,40}[\"\u{FEFF}]?[ -~]{0,20}"
        ) {
            let json = format!("\"{}\"", escaped(&text, false));
            prop_assert_eq!(&json, &serde_json::to_string(&text).unwrap());
            let expected: String = text.chars().filter(|c| {
                let mut b = [0u8; 4];
                invisible_len(c.encode_utf8(&mut b).as_bytes()) == 0
            }).collect();
            prop_assert_eq!(
                format!("\"{}\"", escaped(&text, true)),
                serde_json::to_string(&expected).unwrap()
            );
        }
    }
}
