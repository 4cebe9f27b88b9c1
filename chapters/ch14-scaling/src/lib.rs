//! Chapter 14: scaling up — an 8B model on two cores in 6 GB.
//!
//! Every chapter so far ran models of 135M and 270M parameters, whose weights fit in the
//! processor's last-level cache. The models people run on CPUs have 7–9B: 4.7 GB of weights
//! at 4.5 bits, read from DRAM once per generated token. This chapter is about what changes
//! then: memory, not arithmetic, decides the speed, and memory, not speed, decides whether
//! the model runs at all.
//!
//! - [`large`]: 7–9B-shaped models written from a recipe (a real shape and vocabulary,
//!   seeded weights at trained scale) in llama.cpp's file types, full or cut to a few layers.
//! - [`budget`]: what a run will hold in memory, from the header, before anything is
//!   allocated; a run that cannot fit is refused with the sizes and the flags that help.
//! - [`run`]: chapter 10's engine behind that check (`--mem-budget` prints the budget).
//!
//! And in earlier chapters, through their own seams: chapter 10's loader releases the mapped
//! pages of every matrix chapter 8 repacks ([`ReleasePages`]), so the weights are in memory
//! once, not twice; chapter 8 packs a matrix's row groups in parallel. And the KV cache keeps
//! keys and values in f16 or q8_0 (llama.cpp's `--cache-type-k`, `--cache-type-v`): chapter
//! 3's `KvRows`, chapter 5's `RowType`, chapter 6's `ROW_Q8_0`, chapter 8's attention reading
//! the encoded rows a tile at a time.

pub mod budget;
pub mod large;
pub mod run;
