#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| release_harness::tools::fuzzing::repair_answer(data));
