//! The JSON text the harness writes on every release (the result, the audit record, the
//! judge's request body): `sonic-rs`'s serializer, which escapes strings sixteen or
//! thirty-two bytes at a time where `serde_json` looks at every byte (about 12
//! instructions per byte of text, a third of a judged release's serialization). It writes
//! exactly what `serde_json` writes: the same escapes, the same numbers (both format floats
//! with `zmij`), map entries in order. The tests hold the two to that. Parsing stays with
//! `serde_json`.

use serde::Serialize;

/// Why a value could not be written as JSON (a map with a key that is not a string, a
/// `Serialize` impl that fails).
pub type JsonError = sonic_rs::Error;

/// `value` as compact JSON text, as `serde_json::to_string` writes it.
pub fn to_string<T: Serialize + ?Sized>(value: &T) -> Result<String, JsonError> {
    to_string_sized(value, 256)
}

/// [`to_string`] into a buffer of `capacity` bytes to start with (the text's expected size:
/// fewer reallocations and copies on the way).
pub fn to_string_sized<T: Serialize + ?Sized>(
    value: &T,
    capacity: usize,
) -> Result<String, JsonError> {
    let mut out = Vec::with_capacity(capacity);
    sonic_rs::to_writer(&mut out, value)?;
    // The serializer writes UTF-8 only; the check is one pass over bytes just written.
    String::from_utf8(out).map_err(|_| serde::ser::Error::custom("the JSON text is not UTF-8"))
}

/// The high bit of each of the eight bytes of `chunk` that needs a closer look: a control
/// byte, `"`, `\\`, or (when stripping invisible controls) any byte of a non-ASCII
/// character. The classic "has a byte less than / equal to" word tests can also flag a
/// byte above a flagged one, never one below: the lowest flag is always a special byte.
pub fn special_bytes(chunk: &[u8], strip: bool) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut word = [0u8; 8];
    word.copy_from_slice(chunk);
    let v = u64::from_le_bytes(word);
    let zero = |x: u64| x.wrapping_sub(ONES) & !x;
    let control = v.wrapping_sub(ONES * 0x20) & !v;
    let quote = zero(v ^ (ONES * u64::from(b'"')));
    let backslash = zero(v ^ (ONES * u64::from(b'\\')));
    let non_ascii = if strip { v } else { 0 };
    (control | quote | backslash | non_ascii) & HIGH
}

/// Whether `text` is written in a JSON string as it is: no control byte, `"` or `\\`
/// (eight bytes at a time). Its escaped length is then its length.
pub fn escapes_nothing(text: &[u8]) -> bool {
    let mut chunks = text.chunks_exact(8);
    let words = chunks
        .by_ref()
        .all(|chunk| special_bytes(chunk, false) == 0);
    // The last few bytes, padded with spaces (which escape nothing) to a word.
    let mut last = [b' '; 8];
    let rest = chunks.remainder();
    last[..rest.len()].copy_from_slice(rest);
    words && special_bytes(&last, false) == 0
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    /// JSON values with keys and strings of any characters (controls, quotes, backslashes,
    /// DEL, invisible and non-ASCII characters, long runs), numbers of every kind, nested
    /// three deep.
    pub(crate) fn json_value() -> impl Strategy<Value = Value> {
        let text = prop_oneof![
            "[\"\\\\/\n\t\r\u{8}\u{c}\u{b}\u{1}\u{1f}\u{7f}\u{200B}\u{FEFF}é😀a-z ]{0,12}",
            "[a-z \"\\\\\n\u{1}é]{30,90}",
            any::<String>(),
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            text.clone().prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec((text.clone(), inner), 0..4)
                    .prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
    }

    #[test]
    fn writes_what_serde_json_writes_for_the_awkward_cases() {
        for value in [
            serde_json::json!({"a": -0.0, "b": 1.38, "c": 1e300, "d": 5e-324, "e": u64::MAX, "f": i64::MIN}),
            serde_json::json!(["\u{0}\u{1f}\u{7f}\"\\/\u{2028}", "", "x".repeat(100)]),
            serde_json::json!({"z": 1, "a": 2, "": null, "é": [true, false]}),
        ] {
            assert_eq!(
                to_string(&value).unwrap(),
                serde_json::to_string(&value).unwrap()
            );
        }
        assert_eq!(
            to_string(&f64::NAN).unwrap(),
            serde_json::to_string(&f64::NAN).unwrap()
        );
    }

    proptest! {
        /// The word test agrees with serde_json: a text escapes nothing exactly when its
        /// JSON string is the text in quotes.
        #[test]
        fn a_text_escapes_nothing_when_its_json_is_itself(
            text in "[a-z \"\\\\\n\u{1}\u{1f}\u{7f}é😀]{0,40}",
        ) {
            let json = serde_json::to_string(&text).unwrap();
            prop_assert_eq!(escapes_nothing(text.as_bytes()), json.len() == text.len() + 2);
        }

        #[test]
        fn writes_what_serde_json_writes(value in json_value(), capacity in 0usize..64) {
            prop_assert_eq!(
                to_string_sized(&value, capacity).unwrap(),
                serde_json::to_string(&value).unwrap()
            );
        }
    }
}
