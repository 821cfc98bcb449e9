//! testkit's own integration tests, one binary: the throwaway test databases (`databases`) and
//! the network-namespace plumbing of the partitioned cluster (`netns`).

mod databases;
mod netns;
