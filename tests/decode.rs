//! The schema-driven decoder: TensorFlow's golden parses, error cases, and
//! property tests against prost encodings.

mod decode {
    mod alloc;
    pub mod common;
    mod errors;
    mod golden;
    mod props;
    mod tf_semantics;
}
