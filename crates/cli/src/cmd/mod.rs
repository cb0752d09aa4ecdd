pub mod chunk;
pub mod demo;
pub mod key;
pub mod lab;
pub mod mount;
pub mod remote;
pub mod similarity;
pub mod store;
