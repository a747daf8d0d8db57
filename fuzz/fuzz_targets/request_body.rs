#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| release_harness::tools::fuzzing::request_body(data));
