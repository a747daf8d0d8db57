//! The chat-completion envelope as the harness reads it: [`Envelope`], deserialized
//! straight from the model's answer (async-openai's `create_byot` response type). Only the
//! parts [`super::verdict::read_completion`] looks at are kept; nothing else is copied.

/// The parts of a chat-completion envelope the harness reads, taken from the answer's bytes
/// in one pass (everything else is skipped unread, no JSON tree is built). Each part is
/// read as leniently as a lookup in the parsed JSON would be: a value of another type
/// counts as absent (a `choices` that is no array, a non-string `finish_reason`, a negative
/// or fractional token count), a key written twice counts as its last value, and an answer
/// that is not an object has none of the parts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Envelope {
    /// The first element of `choices`, if that is a non-empty array.
    pub(super) choice: Option<Choice>,
    pub(super) prompt_tokens: Option<u64>,
    pub(super) completion_tokens: Option<u64>,
}

/// The first choice (its parts only when it is an object).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Choice {
    /// Present when the key is, whatever its value (`null` included).
    pub(super) message: Option<Message>,
    pub(super) finish_reason: Option<String>,
}

/// The first choice's message (its parts only when it is an object).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Message {
    pub(super) content: Option<String>,
    pub(super) refusal: Option<String>,
}

impl Envelope {
    /// The first choice's message content, if it is a string.
    pub fn content(&self) -> Option<&str> {
        self.choice
            .as_ref()
            .and_then(|c| c.message.as_ref())
            .and_then(|m| m.content.as_deref())
    }
}

/// Reading the envelope: one visitor per level, each taking the keys it knows from an
/// object and skipping everything else; any other JSON type at a level reads as empty.
mod de {
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::{Deserialize, Deserializer, Error, IgnoredAny, MapAccess, SeqAccess, Visitor};

    use super::{Choice, Envelope, Message};

    /// Visitor methods that read each listed JSON type as `$value`, skipping its contents.
    macro_rules! read_as {
        ($value:expr; $($kind:ident)*) => { $( read_as!(@ $kind $value); )* };
        (@ map $v:expr) => {
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok($v)
            }
        };
        (@ seq $v:expr) => {
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
                while s.next_element::<IgnoredAny>()?.is_some() {}
                Ok($v)
            }
        };
        (@ unit $v:expr) => {
            fn visit_unit<E: Error>(self) -> Result<Self::Value, E> { Ok($v) }
        };
        (@ bool $v:expr) => {
            fn visit_bool<E: Error>(self, _: bool) -> Result<Self::Value, E> { Ok($v) }
        };
        (@ i64 $v:expr) => {
            fn visit_i64<E: Error>(self, _: i64) -> Result<Self::Value, E> { Ok($v) }
        };
        (@ u64 $v:expr) => {
            fn visit_u64<E: Error>(self, _: u64) -> Result<Self::Value, E> { Ok($v) }
        };
        (@ f64 $v:expr) => {
            fn visit_f64<E: Error>(self, _: f64) -> Result<Self::Value, E> { Ok($v) }
        };
        (@ str $v:expr) => {
            fn visit_str<E: Error>(self, _: &str) -> Result<Self::Value, E> { Ok($v) }
        };
    }

    /// A level read from an object's keys (each offered once per time it is written, so the
    /// last one counts).
    trait FromObject: Default {
        /// Reads the value of `key` if this level reads that key; answers whether it did
        /// (the caller skips any other value).
        fn entry<'de, A: MapAccess<'de>>(
            &mut self,
            key: &str,
            map: &mut A,
        ) -> Result<bool, A::Error>;
    }

    /// A value read as `T` when it is an object, else as `T::default()`.
    struct Object<T>(T);

    impl<'de, T: FromObject> Deserialize<'de> for Object<T> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V<T>(PhantomData<T>);
            impl<'de, T: FromObject> Visitor<'de> for V<T> {
                type Value = Object<T>;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("any JSON value")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Object<T>, A::Error> {
                    let mut value = T::default();
                    while let Some(key) = map.next_key::<Key>()? {
                        if !value.entry(key.0, &mut map)? {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                    Ok(Object(value))
                }
                read_as!(Object(T::default()); seq unit bool i64 u64 f64 str);
            }
            d.deserialize_any(V(PhantomData))
        }
    }

    /// An object key: one of the few read here, or "" for any other (nothing is copied).
    struct Key(&'static str);

    impl<'de> Deserialize<'de> for Key {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl Visitor<'_> for V {
                type Value = Key;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("an object key")
                }
                fn visit_str<E: Error>(self, key: &str) -> Result<Key, E> {
                    const READ: [&str; 8] = [
                        "choices",
                        "usage",
                        "message",
                        "finish_reason",
                        "content",
                        "refusal",
                        "prompt_tokens",
                        "completion_tokens",
                    ];
                    Ok(Key(READ.into_iter().find(|k| *k == key).unwrap_or("")))
                }
            }
            d.deserialize_str(V)
        }
    }

    /// A string, or `None` for any other JSON value.
    struct MaybeString(Option<String>);

    impl<'de> Deserialize<'de> for MaybeString {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = MaybeString;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("any JSON value")
                }
                fn visit_str<E: Error>(self, s: &str) -> Result<MaybeString, E> {
                    Ok(MaybeString(Some(s.to_string())))
                }
                fn visit_string<E: Error>(self, s: String) -> Result<MaybeString, E> {
                    Ok(MaybeString(Some(s)))
                }
                read_as!(MaybeString(None); map seq unit bool i64 u64 f64);
            }
            d.deserialize_any(V)
        }
    }

    /// A count as `serde_json::Value::as_u64` reads one: a non-negative integer that fits a
    /// `u64`; `None` for anything else (a fraction, a float, a string).
    struct MaybeCount(Option<u64>);

    impl<'de> Deserialize<'de> for MaybeCount {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = MaybeCount;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("any JSON value")
                }
                fn visit_u64<E: Error>(self, n: u64) -> Result<MaybeCount, E> {
                    Ok(MaybeCount(Some(n)))
                }
                fn visit_i64<E: Error>(self, n: i64) -> Result<MaybeCount, E> {
                    Ok(MaybeCount(u64::try_from(n).ok()))
                }
                read_as!(MaybeCount(None); map seq unit bool f64 str);
            }
            d.deserialize_any(V)
        }
    }

    /// `choices`: its first element when it is a non-empty array (the rest skipped).
    struct FirstChoice(Option<Choice>);

    impl<'de> Deserialize<'de> for FirstChoice {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = FirstChoice;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("any JSON value")
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<FirstChoice, A::Error> {
                    let first = s.next_element::<Object<Choice>>()?.map(|c| c.0);
                    while s.next_element::<IgnoredAny>()?.is_some() {}
                    Ok(FirstChoice(first))
                }
                read_as!(FirstChoice(None); map unit bool i64 u64 f64 str);
            }
            d.deserialize_any(V)
        }
    }

    /// `usage`: the two counts.
    #[derive(Default)]
    struct Usage {
        prompt_tokens: Option<u64>,
        completion_tokens: Option<u64>,
    }

    impl FromObject for Envelope {
        fn entry<'de, A: MapAccess<'de>>(
            &mut self,
            key: &str,
            map: &mut A,
        ) -> Result<bool, A::Error> {
            match key {
                "choices" => self.choice = map.next_value::<FirstChoice>()?.0,
                "usage" => {
                    let usage = map.next_value::<Object<Usage>>()?.0;
                    self.prompt_tokens = usage.prompt_tokens;
                    self.completion_tokens = usage.completion_tokens;
                }
                _ => return Ok(false),
            }
            Ok(true)
        }
    }

    impl FromObject for Choice {
        fn entry<'de, A: MapAccess<'de>>(
            &mut self,
            key: &str,
            map: &mut A,
        ) -> Result<bool, A::Error> {
            match key {
                "message" => self.message = Some(map.next_value::<Object<Message>>()?.0),
                "finish_reason" => self.finish_reason = map.next_value::<MaybeString>()?.0,
                _ => return Ok(false),
            }
            Ok(true)
        }
    }

    impl FromObject for Message {
        fn entry<'de, A: MapAccess<'de>>(
            &mut self,
            key: &str,
            map: &mut A,
        ) -> Result<bool, A::Error> {
            match key {
                "content" => self.content = map.next_value::<MaybeString>()?.0,
                "refusal" => self.refusal = map.next_value::<MaybeString>()?.0,
                _ => return Ok(false),
            }
            Ok(true)
        }
    }

    impl FromObject for Usage {
        fn entry<'de, A: MapAccess<'de>>(
            &mut self,
            key: &str,
            map: &mut A,
        ) -> Result<bool, A::Error> {
            match key {
                "prompt_tokens" => self.prompt_tokens = map.next_value::<MaybeCount>()?.0,
                "completion_tokens" => self.completion_tokens = map.next_value::<MaybeCount>()?.0,
                _ => return Ok(false),
            }
            Ok(true)
        }
    }

    impl<'de> Deserialize<'de> for Envelope {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            Ok(Object::<Envelope>::deserialize(d)?.0)
        }
    }
}
