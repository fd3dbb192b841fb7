//! The volume layer: the devices of one filesystem and the chunk map.
