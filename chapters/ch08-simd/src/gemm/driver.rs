//! The driver of a packed product: [`PackedMatrix::gemm_groups`] checks that the matrix and the
//! panels agree, then walks its groups of 16 rows and, in each, the tokens in tiles of
//! [`TILE`](super::TILE), one micro-kernel call per tile. Threads share a product by taking
//! disjoint ranges of groups.

use super::{ActPanels, PackedMatrix};
#[cfg(target_arch = "x86_64")]
use super::{GROUP, TILE, avx512};

/// Where a tile's results go: `out[t * ld + row]`.
#[derive(Clone, Copy)]
pub struct OutPtr(pub *mut f32);
// SAFETY: an `OutPtr` is only a pointer; it is written through only by the unsafe
// `gemm_groups`, whose callers give each thread its own rows of a buffer that outlives them.
unsafe impl Send for OutPtr {}
// SAFETY: as for `Send`: each thread sharing it writes only its own rows.
unsafe impl Sync for OutPtr {}

impl PackedMatrix {
    /// Rows `groups` (in units of [`GROUP`]) of `out = x Wᵀ` for every token of `acts`:
    /// `out` is `(acts.n, rows)`.
    ///
    /// # Safety
    /// `out` must point to `acts.n * rows` floats, and no other thread may access the rows of
    /// `groups` meanwhile. (That `acts` and `self` are consistent is checked.)
    ///
    /// [`GROUP`]: super::GROUP
    pub unsafe fn gemm_groups(
        &self,
        acts: &ActPanels,
        groups: std::ops::Range<usize>,
        out: OutPtr,
    ) {
        assert!(
            acts.nb == self.nb && acts.qk == self.ty.qk(),
            "activations have {} blocks of {}, rows {} of {}",
            acts.nb,
            acts.qk,
            self.nb,
            self.ty.qk()
        );
        assert!(groups.end <= self.groups);
        self.check_layout();
        acts.check_sizes();
        #[cfg(target_arch = "x86_64")]
        for g in groups {
            let valid = (self.rows - g * GROUP).min(GROUP);
            for t0 in (0..acts.n).step_by(TILE) {
                let tile = acts.tile(t0);
                // SAFETY: packed matrices exist only where the CPU has AVX-512 F, BW and VNNI
                // (`pack` checks). Group g < groups and the tile of tokens `t0..t0 + stride`
                // are inside `data` and `acts` (checked above). `dst` is token t0's row at
                // column `16g`; the kernel writes `stride` tokens' `valid` columns from it,
                // inside the `acts.n · rows` floats the caller promised, in rows of `groups`
                // that only this thread writes.
                unsafe {
                    let dst = out.0.add(t0 * self.rows + g * GROUP);
                    avx512::tile(self, g, &tile, dst, valid);
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (acts, groups, out);
            unreachable!("packed matrices are only built on x86_64");
        }
    }
}
