//! The answer of a record-reading script (`begin.lua`, `records.lua`): one string of items,
//! `LEN:BYTES` or `-` for nil (written by `put` in `record_reader.lua`), which costs far less
//! to read than nested replies. Entry points: [`read_begin`], [`read_records`], [`Items`].

use std::ops::Range;
use std::time::Duration;

use crate::domain::evidence_guard::Rule;
use crate::domain::invocation::{CallRejection, RawRecord, RECORD_FIELDS};
use redis::Value;

use crate::store::{Begin, CallsList, LoadedRecords};

/// The items of a record-reading script's answer: `LEN:BYTES`, or `-` for nil.
pub(super) struct Items<'a> {
    answer: &'a [u8],
    /// The whole answer as text, when it is UTF-8 (nearly always): every item is then text
    /// too, and is taken from it without checking its bytes again. An item sits between
    /// ASCII (the `:` before it, the next item's length or `-`, or the end), so it begins
    /// and ends on character boundaries of a UTF-8 answer.
    text: Option<&'a str>,
    /// Where the next item starts.
    at: usize,
}

impl<'a> Items<'a> {
    pub(super) fn new(answer: &'a [u8]) -> Items<'a> {
        Items {
            answer,
            text: std::str::from_utf8(answer).ok(),
            at: 0,
        }
    }

    /// Where the next item is in the answer (None for nil), or `what` if the answer ends
    /// or is malformed here. One pass over its length's digits up to the `:`, rather than
    /// finding the `:` first and reading the digits after.
    fn next_range(&mut self, what: &'static str) -> Result<Option<Range<usize>>, &'static str> {
        let answer = self.answer;
        let mut at = self.at;
        if answer.get(at) == Some(&b'-') {
            self.at = at + 1;
            return Ok(None);
        }
        let mut len = 0usize;
        loop {
            match answer.get(at) {
                // At least one digit before the `:`.
                Some(b':') if at > self.at => break,
                Some(&byte) => len = then_digit(len, byte).ok_or(what)?,
                None => return Err(what),
            }
            at += 1;
        }
        let start = at + 1;
        let end = start
            .checked_add(len)
            .filter(|end| *end <= answer.len())
            .ok_or(what)?;
        self.at = end;
        Ok(Some(start..end))
    }

    /// The next item (None for nil), or `what` if the answer ends or is malformed here.
    fn next(&mut self, what: &'static str) -> Result<Option<Item<'a>>, &'static str> {
        let Some(range) = self.next_range(what)? else {
            return Ok(None);
        };
        let item = match self.text.and_then(|text| text.get(range.clone())) {
            Some(text) => Item::Text(text),
            None => Item::Bytes(&self.answer[range]),
        };
        Ok(Some(item))
    }

    /// The next item, which must be there.
    fn item(&mut self, what: &'static str) -> Result<Item<'a>, &'static str> {
        self.next(what)?.ok_or(what)
    }

    fn text(&mut self, what: &'static str) -> Result<&'a str, &'static str> {
        self.item(what)?.text().ok_or(what)
    }

    fn number(&mut self, what: &'static str) -> Result<u64, &'static str> {
        let range = self.next_range(what)?.ok_or(what)?;
        decimal(&self.answer[range])
            .and_then(|n| u64::try_from(n).ok())
            .ok_or(what)
    }

    /// Nothing may follow the last item.
    pub(super) fn end(&self) -> Result<(), &'static str> {
        if self.at == self.answer.len() {
            Ok(())
        } else {
            Err("trailing bytes")
        }
    }
}

/// An item of an answer: text, or bytes that are not UTF-8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item<'a> {
    Text(&'a str),
    Bytes(&'a [u8]),
}

impl<'a> Item<'a> {
    /// The item as text, if it is UTF-8.
    fn text(self) -> Option<&'a str> {
        match self {
            Item::Text(text) => Some(text),
            Item::Bytes(bytes) => std::str::from_utf8(bytes).ok(),
        }
    }
}

/// `digits` as a number: one or more ASCII digits, nothing else, no overflow.
fn decimal(digits: &[u8]) -> Option<usize> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0usize, |n, &d| then_digit(n, d))
}

/// `n` with the ASCII digit `byte` written after it; None for any other byte or an
/// overflow.
fn then_digit(n: usize, byte: u8) -> Option<usize> {
    let digit = byte.checked_sub(b'0').filter(|d| *d <= 9)?;
    n.checked_mul(10)?.checked_add(usize::from(digit))
}

/// What the begin script answered: the end of the begin, or the lock taken with what it
/// read of the run so far.
#[derive(Debug)]
pub(super) enum Begun {
    Done(Begin),
    Taken {
        calls: CallsList,
        loaded: LoadedRecords,
        /// How many of the run's ids to look up (the cited ones, then the listed ones most
        /// recent first, as `lookup_ids` orders them) the script answered.
        answered: usize,
        /// Whether ids are left to look up after those: the harness reads their records
        /// with the records script.
        more: bool,
    },
}

/// The begin script's answer (`begin.lua`): one string of items, or after `taken` a pair
/// of that string and the calls list as read.
pub(super) fn read_begin(answer: &Value, max_record_bytes: u64) -> Result<Begun, &'static str> {
    let (items, listed): (&[u8], Option<&[Value]>) = match answer {
        Value::BulkString(items) => (items, None),
        Value::Array(pair) => match pair.as_slice() {
            [Value::BulkString(items), Value::Array(listed)] => (items, Some(listed)),
            _ => return Err("begin answer"),
        },
        _ => return Err("begin answer"),
    };
    let mut items = Items::new(items);
    let begun = match items.text("begin answer")? {
        "stored" => Begun::Done(Begin::Stored(items.text("stored result")?.to_string())),
        "locked" => Begun::Done(Begin::Locked {
            token: items.text("lock holder")?.to_string(),
            remaining: Duration::from_millis(items.number("lease left")?),
        }),
        "cancelled" => Begun::Done(Begin::Cancelled),
        "taken" => {
            let calls = read_calls(&mut items, listed.ok_or("calls list")?)?;
            let (loaded, answered) = read_records(&mut items, max_record_bytes)?;
            let more = match items.text("more")? {
                "more" => true,
                "done" => false,
                _ => return Err("more"),
            };
            Begun::Taken {
                calls,
                loaded,
                answered,
                more,
            }
        }
        _ => return Err("begin answer"),
    };
    items.end()?;
    Ok(begun)
}

/// The calls list `begin.lua` read: how it answered, and the ids (`listed`, the pair's
/// second element).
fn read_calls(items: &mut Items<'_>, listed: &[Value]) -> Result<CallsList, &'static str> {
    let calls = match items.text("calls answer")? {
        "ok" => {
            let mut ids = Vec::with_capacity(listed.len());
            for id in listed {
                let Value::BulkString(id) = id else {
                    return Err("call id");
                };
                // Over-long ids come as "", ids that are not UTF-8 are left out: neither
                // can name a record.
                if let Ok(id) = std::str::from_utf8(id) {
                    if !id.is_empty() {
                        ids.push(id.to_string());
                    }
                }
            }
            CallsList::Ids(ids)
        }
        "missing" => CallsList::Ids(Vec::new()),
        "wrong_type" => CallsList::Unreadable(CallRejection::new(
            Rule::CallsWrongType,
            format!(
                "the run's calls key is a {}, not a list",
                items.text("calls type")?
            ),
        )),
        "too_large" => crate::store::calls_too_large(items.number("calls size")?),
        _ => return Err("calls answer"),
    };
    Ok(calls)
}

/// The records of a script's answer (`record_reader.lua`): their number, then per
/// record its id and its answer. A missing record is left out; an unreadable one is an
/// unusable call with its rule. Answers them and how many ids were answered.
pub(super) fn read_records(
    items: &mut Items<'_>,
    max_record_bytes: u64,
) -> Result<(LoadedRecords, usize), &'static str> {
    let mut loaded = LoadedRecords::default();
    let answered = items.number("number of records")?;
    for _ in 0..answered {
        let id = items.text("record id")?.to_string();
        let why = match items.text("record answer")? {
            "missing" => continue,
            "ok" => {
                let size = items.number("record size")?;
                // `size` is what the fields read hold (the script answers no more than
                // evidence.max_record_bytes of them): the record's one allocation.
                let capacity = usize::try_from(size.min(max_record_bytes)).unwrap_or(0);
                let mut record = RawRecord::with_capacity(capacity);
                let mut not_utf8 = None;
                for (index, field) in RECORD_FIELDS.into_iter().enumerate() {
                    if let Some(value) = items.next("record field")? {
                        match value.text() {
                            Some(text) => record.set(index, text),
                            None => {
                                not_utf8.get_or_insert(field);
                            }
                        }
                    }
                }
                match not_utf8 {
                    None => {
                        loaded.bytes += size;
                        loaded.records.insert(id, record);
                        continue;
                    }
                    Some(field) => CallRejection::new(
                        Rule::RecordNotUtf8,
                        format!("the record's {field} is not UTF-8"),
                    ),
                }
            }
            "wrong_type" => CallRejection::new(
                Rule::RecordWrongType,
                format!("the record is a {}, not a hash", items.text("record type")?),
            ),
            "too_large" => {
                crate::store::record_too_large(items.number("record size")?, max_record_bytes)
            }
            "over_budget" => crate::store::record_over_budget(items.number("record size")?),
            _ => return Err("record answer"),
        };
        loaded.unreadable.insert(id, why);
    }
    let answered = usize::try_from(answered).map_err(|_| "number of records")?;
    Ok((loaded, answered))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Items as a script writes them: `LEN:BYTES`, or `-` for `None`.
    fn answer(items: &[Option<&[u8]>]) -> Vec<u8> {
        let mut out = Vec::new();
        for item in items {
            match item {
                Some(bytes) => {
                    out.extend_from_slice(format!("{}:", bytes.len()).as_bytes());
                    out.extend_from_slice(bytes);
                }
                None => out.push(b'-'),
            }
        }
        out
    }

    /// One record's items: its id, `ok`, its size and the seven fields, `-` for the last.
    fn record_items<'a>(id: &'a [u8], field: &'a [u8]) -> Vec<Option<&'a [u8]>> {
        let mut items = vec![Some(id), Some(&b"ok"[..]), Some(&b"10"[..])];
        items.extend(std::iter::repeat_n(Some(field), RECORD_FIELDS.len() - 1));
        items.push(None);
        items
    }

    fn read(items: &[Option<&[u8]>]) -> Result<LoadedRecords, &'static str> {
        let bytes = answer(items);
        let mut items = Items::new(&bytes);
        let (loaded, _) = read_records(&mut items, 1 << 20)?;
        items.end().map(|()| loaded)
    }

    #[test]
    fn characters_at_the_edges_of_items_are_read_whole() {
        let mut items = vec![Some(&b"2"[..])];
        items.extend(record_items("é-1".as_bytes(), "é mid €".as_bytes()));
        items.extend(record_items(b"c-2", "€".as_bytes()));
        let loaded = read(&items).unwrap();
        assert!(loaded.unreadable.is_empty());
        assert_eq!(loaded.records["é-1"].get("run_id"), Some("é mid €"));
        assert_eq!(loaded.records["é-1"].get("finished_at"), None);
        assert_eq!(loaded.records["c-2"].get("agent_result"), Some("€"));
        assert_eq!(loaded.bytes, 20);
    }

    #[test]
    fn a_record_that_is_not_utf8_is_unreadable_and_the_others_are_read() {
        let euro = "€".as_bytes();
        for bad in [&b"\xff"[..], &euro[..1], &euro[1..]] {
            let mut items = vec![Some(&b"2"[..])];
            items.extend(record_items(b"c-bin", bad));
            items.extend(record_items(b"c-ok", b"text"));
            let loaded = read(&items).unwrap();
            assert_eq!(
                loaded.unreadable["c-bin"].rule,
                Rule::RecordNotUtf8,
                "{bad:?}"
            );
            assert_eq!(loaded.records["c-ok"].get("tool_name"), Some("text"));
            assert!(!loaded.records.contains_key("c-bin"));
        }
        // A character split over two items is not UTF-8 in either.
        let mut items = vec![Some(&b"1"[..]), Some(&b"c-split"[..])];
        items.extend([Some(&b"ok"[..]), Some(&b"3"[..]), Some(&euro[..2])]);
        items.push(Some(&euro[2..]));
        items.extend(std::iter::repeat_n(None, RECORD_FIELDS.len() - 2));
        let loaded = read(&items).unwrap();
        assert_eq!(loaded.unreadable["c-split"].rule, Rule::RecordNotUtf8);
    }

    #[test]
    fn a_malformed_answer_is_an_error() {
        let good = answer(&[Some(&b"0"[..])]);
        assert_eq!(good, b"1:0");
        for bad in [
            &b""[..],
            b"x:0",
            b":0",
            b"+1:0",
            b"2:0",
            b"1:0trailing",
            b"1:1",
            b"99999999999999999999999:0",
        ] {
            let mut items = Items::new(bad);
            let read = read_records(&mut items, 1 << 20).and_then(|_| items.end());
            assert!(read.is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    /// The reader as it was: find the `:`, then read the digits before it.
    fn next_range_by_search(answer: &[u8], at: usize) -> Result<Option<Range<usize>>, ()> {
        let rest = &answer[at..];
        if rest.first() == Some(&b'-') {
            return Ok(None);
        }
        let colon = memchr::memchr(b':', rest).ok_or(())?;
        let len = decimal(&rest[..colon]).ok_or(())?;
        let start = at + colon + 1;
        let end = start.checked_add(len).ok_or(())?;
        if end > answer.len() {
            return Err(());
        }
        Ok(Some(start..end))
    }

    proptest::proptest! {
        /// Items are read as finding the `:` first read them, from any bytes: answers as
        /// written, and the same with bytes changed, cut off or long digit runs put in.
        #[test]
        fn items_are_read_as_before(
            items in proptest::collection::vec(proptest::option::of(proptest::collection::vec(proptest::num::u8::ANY, 0..12)), 0..6),
            edits in proptest::collection::vec((proptest::num::usize::ANY, proptest::sample::select(b"0123456789:-x\xff".to_vec())), 0..3),
            digits in proptest::option::of("[0-9]{15,25}"),
            cut in proptest::num::usize::ANY,
        ) {
            let items: Vec<Option<&[u8]>> = items.iter().map(|i| i.as_deref()).collect();
            let mut bytes = answer(&items);
            if let Some(digits) = digits {
                bytes.splice(0..0, digits.bytes().chain(*b":"));
            }
            for (at, byte) in edits {
                if !bytes.is_empty() {
                    let i = at % bytes.len();
                    bytes[i] = byte;
                }
            }
            bytes.truncate(cut % (bytes.len() + 1).max(1) + bytes.len() / 2);
            let mut items = Items::new(&bytes);
            loop {
                let at = items.at;
                let before = next_range_by_search(&bytes, at);
                let now = items.next_range("item").map_err(|_| ());
                proptest::prop_assert_eq!(&now, &before, "at {} of {:?}", at, bytes);
                if now.is_err() || items.at >= bytes.len() {
                    break;
                }
                if now == Ok(None) {
                    proptest::prop_assert_eq!(items.at, at + 1);
                }
            }
        }
    }
}
