//! Integration tests of object storage and the record index, against a real
//! S3 server (`s3s-fs`) that each test starts in-process on 127.0.0.1: no
//! mocks of the store's API. Objects are uploaded through the S3 API.
#![cfg(feature = "object-store")]

mod common;
#[path = "storage/server.rs"]
mod server;

#[path = "storage/cli.rs"]
mod cli;
#[path = "storage/http.rs"]
mod http;
#[path = "storage/index.rs"]
mod index;
#[path = "storage/read.rs"]
mod read;
#[path = "storage/state.rs"]
mod state;
#[path = "storage/write.rs"]
mod write;
