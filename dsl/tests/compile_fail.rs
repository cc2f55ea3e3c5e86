//! Misuse of the DSL and of the generated launch structs fails to compile, with a message at
//! the offending span (the expected compiler output is in `compile_fail/*.stderr`).

#[test]
fn misuse_does_not_compile() {
    trybuild::TestCases::new().compile_fail("tests/compile_fail/*.rs");
}
