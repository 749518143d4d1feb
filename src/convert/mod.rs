//! Converters from raw data to TFRecord (being built).
