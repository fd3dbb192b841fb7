//! B-trees: verified block reads, a node cache, search and iteration.
