//! The convolution kernel behind [`super::conv2d`]: NHWC, f32, on the CPU.
//!
//! Two methods ([`Method`], chosen per layer by measurement): a direct
//! convolution for narrow windows into few outputs over wide images
//! (`ops/direct.rs`; a CNN's first layer), and im2col + GEMM for the rest,
//! described here. `dx` is always computed by im2col.
//!
//! Why not one im2col matrix and one GEMM: for the LeNet-like CNN at batch
//! 64 that matrix is 50,176 x 25 (5 MB, out of cache), and the GEMM's
//! output has 6 columns, which `gemm` turns into a 6-row problem (it
//! transposes a row-major destination) that fills 6 of its 64-row
//! microkernels' rows. Here, instead:
//!
//! - the batch is cut into blocks of output lines (a few images, or part
//!   of one large image) whose im2col rows fit in the L2 cache
//!   ([`Geometry::block_rows`]);
//! - each block's GEMM writes a channel-major `[out][rows]` block, so the
//!   GEMM's long dimension is the rows (gemm's 64 x 6 microkernel then fits
//!   the 6 output channels exactly);
//! - one pass transposes that block into the NHWC output, adding the bias
//!   and applying ReLU;
//! - backward walks the same blocks: the ReLU mask, `db`, `dW += g^T cols`
//!   (the block's im2col recomputed rather than a batch-sized matrix kept),
//!   and, when the input needs it, `dx` by col2im of `g W`.
//!
//! im2col's column order is (ky, kx, channel), and the two passes lay the
//! matrix out differently, each as gemm reads it without packing (copying)
//! it first, which at 64x64x3 cost more than the multiplies (a profile of
//! the step: 18% in gemm's `pack_lhs`, against 13% in its microkernel):
//! - forward, column-major (`Geometry::im2col_t`): gemm reads a column-major
//!   left-hand side in place when its rows are a multiple of 16. With one
//!   channel (LeNet's first layer) a column's values for one output row are
//!   also one copy of `ow` values, where a row-major row is `k` copies of
//!   `k` values.
//! - backward, row-major with rows padded to 16 values
//!   (`Geometry::padded_width`): the `dW` GEMM reads the matrix transposed,
//!   which gemm reads in place only when those padded rows are whole SIMD
//!   vectors. With one channel the backward keeps the column-major matrix
//!   (`Geometry::backward_im2col` says why).
//!
//! The kernel (candle's `[out, c, k, k]`) is repacked into that order per
//! call, and its gradient back (a few thousand values).
//!
//! Parallelism: the batch is split into `tasks` runs of consecutive images,
//! all but the first on scoped [`crate::spawn`] threads for the call (about
//! 50 us each to start, which the thread tuner weighs like any other cost;
//! rayon's pool is candle's, and clippy.toml keeps our work off it). Each task writes only its own images' output (and `dx`) rows; the
//! tasks' partial `dW` and `db` are summed in task order, so a result
//! depends on the task count alone, never on scheduling. Scratch buffers
//! are per thread and reused across steps (no per-block allocation).

use std::cell::RefCell;
use std::ops::Range;

use candle_core::{CpuStorage, CustomOp3, Device, Layout, Result, Shape, Tensor, bail};

use super::direct;
use super::{View, f32s, gemm_strided, run_tasks};

/// L2-sized im2col blocks: at most this many f32 values (256 KiB).
const BLOCK_VALUES: usize = 64 * 1024;

/// f32 values in the widest SIMD vector gemm uses (AVX-512). gemm reads a
/// matrix in place, without packing (copying) it first, only when the
/// dimension it vectorises is a multiple of this.
const GEMM_LANES: usize = 16;

/// The shapes of one convolution: NHWC input `[b, h, w, c]`, a `k x k`
/// kernel with `out` outputs, stride 1, zero padding `pad` on each side.
///
/// Invariant (checked by [`Geometry::new`]): the padded input is at least
/// `k` on each side and `k >= 1`, so the output is at least 1 x 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Geometry {
    pub b: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub k: usize,
    pub pad: usize,
    pub out: usize,
}

impl Geometry {
    pub fn new(
        (b, h, w, c): (usize, usize, usize, usize),
        k: usize,
        pad: usize,
        out: usize,
    ) -> Result<Geometry> {
        if k == 0 || h + 2 * pad < k || w + 2 * pad < k {
            bail!("conv2d: a {k}x{k} kernel does not fit a {h}x{w} input padded by {pad}");
        }
        Ok(Geometry {
            b,
            h,
            w,
            c,
            k,
            pad,
            out,
        })
    }

    pub fn oh(&self) -> usize {
        self.h + 2 * self.pad + 1 - self.k
    }

    pub fn ow(&self) -> usize {
        self.w + 2 * self.pad + 1 - self.k
    }

    /// im2col's row width: `k * k * c`.
    pub fn width(&self) -> usize {
        self.k * self.k * self.c
    }

    /// Output rows (pixels) per image.
    fn pixels(&self) -> usize {
        self.oh() * self.ow()
    }

    fn image_in(&self) -> usize {
        self.h * self.w * self.c
    }

    fn image_out(&self) -> usize {
        self.pixels() * self.out
    }

    /// Output rows (`oy` lines of `ow` pixels, counted across the images
    /// of a run) per im2col block: as many whole images as fit
    /// [`BLOCK_VALUES`] at the backward pass's stride, and where not one
    /// does (one 64x64x3 image's im2col is 1.2 MB, more than the L2 cache),
    /// as many lines as fit, a multiple of the lines that make whole
    /// [`GEMM_LANES`] of pixels (so that gemm reads the forward pass's block
    /// in place). At least 1.
    pub fn block_rows(&self) -> usize {
        let (oh, ow) = (self.oh(), self.ow());
        let line = (ow * self.backward_stride()).max(1);
        let images = BLOCK_VALUES / (line * oh);
        if images >= 1 {
            return images * oh;
        }
        let fit = (BLOCK_VALUES / line).max(1);
        let step = GEMM_LANES / gcd(ow, GEMM_LANES);
        if fit >= step { fit - fit % step } else { fit }
    }

    /// The image and line of global output row `row` of a run.
    fn line(&self, row: usize) -> (usize, usize) {
        (row / self.oh(), row % self.oh())
    }

    /// The kernel columns `[lo, hi)` whose input column is inside the image
    /// for output column `ox` (the rest read padding).
    fn kx_range(&self, ox: usize) -> (usize, usize) {
        let lo = self.pad.saturating_sub(ox).min(self.k);
        let hi = self.k.min((self.w + self.pad).saturating_sub(ox)).max(lo);
        (lo, hi)
    }

    /// The input row read by kernel row `ky` at output row `oy`, if inside.
    fn input_row(&self, oy: usize, ky: usize) -> Option<usize> {
        (oy + ky).checked_sub(self.pad).filter(|&y| y < self.h)
    }

    /// im2col of output lines `lines` of a run of images `x` (NHWC,
    /// `images * image_in` values) into `cols`, row-major: a row per
    /// output pixel, of `stride` values: the [`width`](Self::width) values
    /// of a window, then zeros.
    fn im2col(&self, x: &[f32], lines: Range<usize>, cols: &mut [f32], stride: usize) {
        let (k, c, width) = (self.k, self.c, self.width());
        let kc = k * c;
        let mut rows = cols.chunks_exact_mut(stride);
        for line in lines {
            let (n, oy) = self.line(line);
            let img = &x[n * self.image_in()..][..self.image_in()];
            for ox in 0..self.ow() {
                let Some(row) = rows.next() else { return };
                let (lo, hi) = self.kx_range(ox);
                let (window, tail) = row.split_at_mut(width);
                tail.fill(0.0);
                for (ky, dst) in window.chunks_exact_mut(kc).enumerate() {
                    let Some(iy) = self.input_row(oy, ky).filter(|_| hi > lo) else {
                        dst.fill(0.0);
                        continue;
                    };
                    let src = (iy * self.w + ox + lo - self.pad) * c;
                    dst[..lo * c].fill(0.0);
                    dst[lo * c..hi * c].copy_from_slice(&img[src..src + (hi - lo) * c]);
                    dst[hi * c..].fill(0.0);
                }
            }
        }
    }

    /// The row stride of the backward pass's im2col: [`width`](Self::width)
    /// rounded up to [`GEMM_LANES`]. Its `dW` GEMM reads the matrix
    /// transposed, and gemm reads a transposed matrix in place only when
    /// its rows come in whole SIMD vectors; otherwise it packs (copies) the
    /// whole matrix first. The zero columns cost 7% more multiplies at 5x5x3
    /// and 5x5x6 and save that copy.
    fn padded_width(&self) -> usize {
        self.width().next_multiple_of(GEMM_LANES)
    }

    /// The row stride of the backward pass's im2col (and of its `dW`):
    /// [`padded_width`](Self::padded_width), but with one channel the
    /// plain width, since there the matrix stays column-major (see
    /// [`backward_im2col`](Self::backward_im2col)).
    fn backward_stride(&self) -> usize {
        match self.c {
            1 => self.width(),
            _ => self.padded_width(),
        }
    }

    /// The backward pass's im2col of output lines `lines` into `cols`;
    /// returns the matrix's view. Row-major with padded rows, except with
    /// one channel: there a row-major row is `k` copies of `k` values and
    /// the padding 28% more multiplies at 5x5, so the forward pass's
    /// column-major matrix, which gemm packs, costs less (a LeNet step took
    /// 1.18x as long with the padded one).
    fn backward_im2col(&self, x: &[f32], lines: Range<usize>, cols: &mut [f32]) -> View {
        let rows = lines.len() * self.ow();
        match self.c {
            1 => {
                self.im2col_t(x, lines, cols);
                View::col_major(rows, self.width())
            }
            _ => {
                let stride = self.padded_width();
                self.im2col(x, lines, cols, stride);
                View::row_major(rows, stride)
            }
        }
    }

    /// im2col of output lines `lines` of a run of images `x`, column-major
    /// (the forward pass's layout, and the backward's with one channel):
    /// column `(ky, kx, ch)` of output row `oy` is channel `ch` of input
    /// row `oy + ky - pad` shifted by `kx - pad`, `ow` values. gemm reads a
    /// column-major left-hand side in place when its rows are a multiple
    /// of [`GEMM_LANES`], where a row-major one is packed (copied) first; and
    /// with one channel each column row is one copy of `ow` values where
    /// the row-major layout makes `ow` copies of `k` (a copy per five
    /// values was a quarter of a LeNet step).
    fn im2col_t(&self, x: &[f32], lines: Range<usize>, cols: &mut [f32]) {
        let (k, c, pad, w) = (self.k, self.c, self.pad, self.w);
        let ow = self.ow();
        let rows = lines.len() * ow;
        for ky in 0..k {
            for kx in 0..k {
                // Output columns whose input column ox + kx - pad is inside.
                let lo = pad.saturating_sub(kx).min(ow);
                let hi = (w + pad).saturating_sub(kx).min(ow).max(lo);
                // Columns (ky, kx, 0..c), one after another.
                let group = &mut cols[(ky * k + kx) * c * rows..][..c * rows];
                for (i, line) in lines.clone().enumerate() {
                    let (n, oy) = self.line(line);
                    let at = i * ow;
                    let src = self.input_row(oy, ky).filter(|_| hi > lo);
                    let Some(iy) = src else {
                        for column in group.chunks_exact_mut(rows) {
                            column[at..at + ow].fill(0.0);
                        }
                        continue;
                    };
                    for column in group.chunks_exact_mut(rows) {
                        column[at..at + lo].fill(0.0);
                        column[at + hi..at + ow].fill(0.0);
                    }
                    let start = (n * self.h + iy) * w + lo + kx - pad;
                    let pixels = &x[start * c..(start + hi - lo) * c];
                    deinterleave(pixels, c, group, rows, at + lo);
                }
            }
        }
    }

    /// col2im: adds each im2col row of `dcols` (output lines `lines`)
    /// back onto the input positions it was read from, in `dx` (the run's
    /// whole images, NHWC).
    fn col2im(&self, dcols: &[f32], lines: Range<usize>, dx: &mut [f32]) {
        let (k, c) = (self.k, self.c);
        let kc = k * c;
        let image_in = self.image_in();
        let mut rows = dcols.chunks_exact(self.width());
        for line in lines {
            let (n, oy) = self.line(line);
            let img = &mut dx[n * image_in..][..image_in];
            for ox in 0..self.ow() {
                let Some(row) = rows.next() else { return };
                let (lo, hi) = self.kx_range(ox);
                for (ky, src) in row.chunks_exact(kc).enumerate() {
                    let Some(iy) = self.input_row(oy, ky).filter(|_| hi > lo) else {
                        continue;
                    };
                    let at = (iy * self.w + ox + lo - self.pad) * c;
                    let dst = &mut img[at..at + (hi - lo) * c];
                    for (d, s) in dst.iter_mut().zip(&src[lo * c..hi * c]) {
                        *d += s;
                    }
                }
            }
        }
    }

    /// candle's kernel `[out, c, k, k]` in im2col's order `[out, k, k, c]`.
    fn repack(&self, kernel: &[f32]) -> Vec<f32> {
        let (k, c) = (self.k, self.c);
        let mut wk = vec![0f32; kernel.len()];
        for (o, src) in kernel.chunks_exact(self.width()).enumerate() {
            let dst = &mut wk[o * self.width()..(o + 1) * self.width()];
            for ch in 0..c {
                for kk in 0..k * k {
                    dst[kk * c + ch] = src[ch * k * k + kk];
                }
            }
        }
        wk
    }

    /// The inverse of [`repack`](Self::repack), for the kernel's gradient.
    fn unpack(&self, wk: &[f32]) -> Vec<f32> {
        let (k, c) = (self.k, self.c);
        let mut kernel = vec![0f32; wk.len()];
        for (o, src) in wk.chunks_exact(self.width()).enumerate() {
            let dst = &mut kernel[o * self.width()..(o + 1) * self.width()];
            for ch in 0..c {
                for kk in 0..k * k {
                    dst[ch * k * k + kk] = src[kk * c + ch];
                }
            }
        }
        kernel
    }
}

/// Per-thread buffers, kept between calls (rayon's workers live as long as
/// the process).
#[derive(Default)]
struct Scratch {
    cols: Vec<f32>,
    block: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs `f` with this thread's scratch buffers (fresh ones if they are
/// somehow in use already, rather than a panic).
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => f(&mut scratch),
        Err(_) => f(&mut Scratch::default()),
    })
}

/// `buf[..n]`, grown (zeroed) when shorter; the contents are stale.
fn sized(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    &mut buf[..n]
}

/// A contiguous f32 slice of a CPU tensor's storage.
fn contiguous<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    match l.contiguous_offsets() {
        Some((start, end)) => Ok(&f32s(s, what)?[start..end]),
        None => bail!("{what}: not contiguous"),
    }
}

/// How a call splits its work: the tests try every split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Plan {
    /// Runs of images computed in parallel (at least 1).
    pub tasks: usize,
    /// Output lines per im2col block; `None`: [`Geometry::block_rows`].
    pub block_rows: Option<usize>,
    /// `None`: [`Method::for_geometry`].
    pub method: Option<Method>,
}

/// The fused convolution (see the module doc): inputs `x` NHWC, `kernel`
/// `[out, c, k, k]`, `bias` `[out]`; output NHWC `[b, oh, ow, out]`.
pub(super) struct Conv2dOp {
    pub k: usize,
    pub pad: usize,
    pub relu: bool,
    /// Runs of images computed in parallel (at least 1).
    pub tasks: usize,
    /// Output lines per im2col block; `None`: [`Geometry::block_rows`].
    pub block_rows: Option<usize>,
    /// How the forward pass (and `dW`, `db` when no `dx` is needed) is
    /// computed.
    pub method: Method,
}

/// The two ways the kernel computes a convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Method {
    /// im2col blocks and GEMMs (this module's doc).
    Im2col,
    /// Shifted chunks of zero-padded planes ([`super::direct`]); `dx`,
    /// when needed, still goes through im2col.
    Direct,
}

impl Method {
    /// The faster for `g`, as measured (`docs/benchmarks.md`, "The direct
    /// convolution"): direct for windows of at most [`DIRECT_MAX_TAPS`]
    /// values into at most [`DIRECT_MAX_OUTPUTS`] outputs whose lines fill
    /// at least three quarters of the direct kernel's chunks. (LeNet's
    /// second layer, 10 pixels wide, fills a third of one: im2col took
    /// 0.71 ms where direct took 1.06; at 30 pixels direct took 3.4 ms
    /// against 4.5.)
    pub fn for_geometry(g: &Geometry) -> Method {
        let chunks = g.ow().next_multiple_of(direct::CHUNK);
        let filled = 4 * g.ow() >= 3 * chunks;
        if filled && g.width() <= DIRECT_MAX_TAPS && g.out <= DIRECT_MAX_OUTPUTS {
            Method::Direct
        } else {
            Method::Im2col
        }
    }
}

/// The largest window (`k * k * c`) computed directly: a 5x5 kernel over
/// 6 channels, the largest measured.
const DIRECT_MAX_TAPS: usize = 150;

/// The most outputs computed directly (16, the largest measured).
const DIRECT_MAX_OUTPUTS: usize = 16;

impl Conv2dOp {
    fn geometry(&self, x: &Layout, kernel: &Layout) -> Result<Geometry> {
        let d = x.shape().dims4()?;
        let (out, kc, kh, kw) = kernel.shape().dims4()?;
        if kc != d.3 || kh != self.k || kw != self.k {
            bail!(
                "conv2d: input has {} channels, kernel is [{out}, {kc}, {kh}, {kw}]",
                d.3
            );
        }
        Geometry::new(d, self.k, self.pad, out)
    }

    /// Images per task, and output lines per block.
    fn split(&self, g: &Geometry) -> (usize, usize) {
        let per_task = g.b.div_ceil(self.tasks.max(1)).max(1);
        let block = self.block_rows.unwrap_or_else(|| g.block_rows()).max(1);
        (per_task, block)
    }

    /// The blocks of a run of `images`: ranges of its output lines.
    fn blocks(&self, g: &Geometry, images: usize) -> impl Iterator<Item = Range<usize>> {
        let (_, block) = self.split(g);
        let lines = images * g.oh();
        (0..lines)
            .step_by(block)
            .map(move |start| start..(start + block).min(lines))
    }

    /// The im2col forward pass of one run of images: `x` and `y` are its
    /// input and output, `wk` the kernel repacked.
    fn forward_run(
        &self,
        g: &Geometry,
        x: &[f32],
        wk: &[f32],
        bias: &[f32],
        y: &mut [f32],
    ) -> Result<()> {
        let (width, out, ow) = (g.width(), g.out, g.ow());
        with_scratch(|s| {
            for lines in self.blocks(g, x.len() / g.image_in().max(1)) {
                let rows = lines.len() * ow;
                let yb = &mut y[lines.start * ow * out..][..rows * out];
                let cols = sized(&mut s.cols, rows * width);
                g.im2col_t(x, lines, cols);
                // Channel-major: element (r, o) at o * rows + r.
                let acc = sized(&mut s.block, rows * out);
                let dst = View::col_major(rows, out);
                let lhs = View::col_major(rows, width);
                // wk^T: element (j, o) at o * width + j.
                let rhs = View::col_major(width, out);
                gemm_strided(
                    (acc, dst),
                    false,
                    (cols, lhs),
                    (wk, rhs),
                    gemm::Parallelism::None,
                )?;
                transpose_bias_relu(acc, rows, bias, self.relu, yb);
            }
            Ok(())
        })
    }

    /// The im2col backward pass of one run of images: returns its partial `dW`
    /// (repacked order) and `db`; writes its images' `dx` when given.
    fn backward_run(
        &self,
        g: &Geometry,
        x: &[f32],
        wk: &[f32],
        res: &[f32],
        grad: &[f32],
        mut dx: Option<&mut [f32]>,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let (width, out, stride, ow) = (g.width(), g.out, g.backward_stride(), g.ow());
        // `dW` with the im2col's padded stride; its zero columns are dropped
        // at the end.
        let mut dw_padded = vec![0f32; out * stride];
        let mut db = vec![0f32; out];
        with_scratch(|s| -> Result<()> {
            for lines in self.blocks(g, x.len() / g.image_in().max(1)) {
                let rows = lines.len() * ow;
                let span = lines.start * ow * out..(lines.end * ow * out);
                // The gradient before the ReLU, row-major [rows, out].
                let gm = sized(&mut s.block, rows * out);
                for ((m, &gv), &r) in gm.iter_mut().zip(&grad[span.clone()]).zip(&res[span]) {
                    *m = if !self.relu || r > 0.0 { gv } else { 0.0 };
                }
                for row in gm.chunks_exact(out) {
                    for (d, v) in db.iter_mut().zip(row) {
                        *d += v;
                    }
                }
                let cols = sized(&mut s.cols, rows * stride);
                let cv = g.backward_im2col(x, lines.clone(), cols);
                let gv = View::row_major(rows, out);
                let none = gemm::Parallelism::None;
                gemm_strided(
                    (&mut dw_padded, View::row_major(out, stride)),
                    true,
                    (gm, gv.transposed()),
                    (cols, cv),
                    none,
                )?;
                if let Some(dx) = dx.as_deref_mut() {
                    // dcols = g @ wk, row-major (as col2im reads it) into
                    // the (now free) im2col buffer.
                    let cv = View::row_major(rows, width);
                    let wv = View::row_major(out, width);
                    gemm_strided((cols, cv), false, (gm, gv), (wk, wv), none)?;
                    g.col2im(cols, lines, dx);
                }
            }
            Ok(())
        })?;
        let dw = dw_padded
            .chunks_exact(stride)
            .flat_map(|row| &row[..width])
            .copied()
            .collect();
        Ok((dw, db))
    }
}

impl Conv2dOp {
    /// [`direct::forward_run`] with this thread's scratch.
    fn direct_forward_run(&self, g: &Geometry, x: &[f32], layer: &direct::Layer, y: &mut [f32]) {
        with_scratch(|s| {
            let planes = sized(&mut s.cols, direct::Planes::new(g).len());
            direct::forward_run(direct::Isa::best(), g, layer, (x, y), planes);
        })
    }

    /// [`direct::backward_run`] with this thread's scratch: `dW` in
    /// candle's order and `db`.
    fn direct_backward_run(
        &self,
        g: &Geometry,
        x: &[f32],
        res: &[f32],
        grad: &[f32],
    ) -> (Vec<f32>, Vec<f32>) {
        with_scratch(|s| {
            let scratch = direct::GradScratch {
                planes: sized(&mut s.cols, direct::Planes::new(g).len()),
                grad: sized(&mut s.block, direct::grad_len(g)),
            };
            direct::backward_run(direct::Isa::best(), g, x, self.relu, res, grad, scratch)
        })
    }
}

/// The greatest common divisor (`gcd(0, b)` is `b`).
fn gcd(a: usize, b: usize) -> usize {
    if a == 0 { b } else { gcd(b % a, a) }
}

/// Splits `pixels` (interleaved, `channels` values each) into `channels`
/// columns of `rows` values laid one after another in `columns`: channel
/// `ch` of pixel `i` goes to `columns[ch * rows + at + i]`. One pass over
/// the pixels; the common channel counts get a loop the compiler unrolls
/// (one pass per channel with a run-time count was 8% of a 64x64x3 CNN
/// step).
fn deinterleave(pixels: &[f32], channels: usize, columns: &mut [f32], rows: usize, at: usize) {
    match channels {
        1 => columns[at..at + pixels.len()].copy_from_slice(pixels),
        2 => deinterleave_of::<2>(pixels, columns, rows, at),
        3 => deinterleave_of::<3>(pixels, columns, rows, at),
        4 => deinterleave_of::<4>(pixels, columns, rows, at),
        6 => deinterleave_of::<6>(pixels, columns, rows, at),
        8 => deinterleave_of::<8>(pixels, columns, rows, at),
        16 => deinterleave_of::<16>(pixels, columns, rows, at),
        _ => {
            for (i, pixel) in pixels.chunks_exact(channels).enumerate() {
                for (ch, &v) in pixel.iter().enumerate() {
                    columns[ch * rows + at + i] = v;
                }
            }
        }
    }
}

/// [`deinterleave`] for `C` channels known at compile time.
fn deinterleave_of<const C: usize>(pixels: &[f32], columns: &mut [f32], rows: usize, at: usize) {
    let (pixels, _) = pixels.as_chunks::<C>();
    let n = pixels.len();
    let mut rest = columns;
    let mut outs: [&mut [f32]; C] = std::array::from_fn(|_| {
        let (column, tail) = std::mem::take(&mut rest).split_at_mut(rows);
        rest = tail;
        &mut column[at..at + n]
    });
    for (i, pixel) in pixels.iter().enumerate() {
        for (out, &v) in outs.iter_mut().zip(pixel) {
            out[i] = v;
        }
    }
}

/// `y[r * out + o] = act(acc[o * rows + r] + bias[o])`: the channel-major
/// GEMM block into NHWC rows.
fn transpose_bias_relu(acc: &[f32], rows: usize, bias: &[f32], relu: bool, y: &mut [f32]) {
    let out = bias.len();
    for (r, row) in y.chunks_exact_mut(out).enumerate().take(rows) {
        for (o, (v, b)) in row.iter_mut().zip(bias).enumerate() {
            let s = acc[o * rows + r] + b;
            *v = if relu { s.max(0.0) } else { s };
        }
    }
}

impl CustomOp3 for Conv2dOp {
    fn name(&self) -> &'static str {
        "tfpipe-conv2d"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ks: &CpuStorage,
        kl: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = self.geometry(xl, kl)?;
        let x = contiguous(xs, xl, "conv2d input")?;
        let kernel = contiguous(ks, kl, "conv2d kernel")?;
        let bias = contiguous(bs, bl, "conv2d bias")?;
        if bias.len() != g.out {
            bail!("conv2d: {} bias values for {} outputs", bias.len(), g.out);
        }
        let mut y = vec![0f32; g.b * g.image_out()];
        let (per_task, _) = self.split(&g);
        let jobs: Vec<(&[f32], &mut [f32])> = x
            .chunks(per_task * g.image_in())
            .zip(y.chunks_mut(per_task * g.image_out()))
            .collect();
        match self.method {
            Method::Direct => {
                let layer = direct::Layer {
                    kernel,
                    bias,
                    relu: self.relu,
                };
                run_tasks(jobs, |(xr, yr)| {
                    self.direct_forward_run(&g, xr, &layer, yr);
                    Ok(())
                })?;
            }
            Method::Im2col => {
                let wk = g.repack(kernel);
                run_tasks(jobs, |(xr, yr)| self.forward_run(&g, xr, &wk, bias, yr))?;
            }
        }
        Ok((
            CpuStorage::F32(y),
            Shape::from((g.b, g.oh(), g.ow(), g.out)),
        ))
    }

    fn bwd(
        &self,
        x: &Tensor,
        kernel: &Tensor,
        _bias: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (x, kernel, grad) = (x.contiguous()?, kernel.contiguous()?, grad.contiguous()?);
        let g = self.geometry(x.layout(), kernel.layout())?;
        let guards = [&x, &kernel, res, &grad].map(|t| t.storage_and_layout());
        let mut data: Vec<&[f32]> = Vec::with_capacity(4);
        for ((storage, layout), what) in guards.iter().zip(["input", "kernel", "output", "grad"]) {
            match &**storage {
                candle_core::Storage::Cpu(s) => data.push(contiguous(s, layout, what)?),
                _ => bail!("conv2d {what}: expected a CPU tensor"),
            }
        }
        let [xd, kd, rd, gd] = data[..] else {
            bail!("conv2d: backward inputs missing");
        };
        if rd.len() != g.b * g.image_out() || gd.len() != rd.len() {
            bail!(
                "conv2d gradient: {} values for {} outputs",
                gd.len(),
                rd.len()
            );
        }
        let (per_task, _) = self.split(&g);
        let mut dx = x.track_op().then(|| vec![0f32; xd.len()]);
        let direct = self.method == Method::Direct && dx.is_none();
        // The im2col path's kernel order (the direct one reads candle's).
        let wk = if direct { Vec::new() } else { g.repack(kd) };
        let (tin, tout) = (per_task * g.image_in(), per_task * g.image_out());
        let dx_runs: Vec<Option<&mut [f32]>> = match dx.as_mut() {
            Some(dx) => dx.chunks_mut(tin).map(Some).collect(),
            None => xd.chunks(tin).map(|_| None).collect(),
        };
        let jobs: Vec<_> = xd
            .chunks(tin)
            .zip(rd.chunks(tout).zip(gd.chunks(tout)))
            .zip(dx_runs)
            .collect();
        let parts = run_tasks(jobs, |((xr, (rr, gr)), dxr)| {
            if direct {
                Ok(self.direct_backward_run(&g, xr, rr, gr))
            } else {
                self.backward_run(&g, xr, &wk, rr, gr, dxr)
            }
        })?;
        let (mut dw, mut db) = (vec![0f32; g.out * g.width()], vec![0f32; g.out]);
        for (pw, pb) in parts {
            dw.iter_mut().zip(&pw).for_each(|(d, v)| *d += v);
            db.iter_mut().zip(&pb).for_each(|(d, v)| *d += v);
        }
        let dw = if direct { dw } else { g.unpack(&dw) };
        let dk = Tensor::from_vec(dw, kernel.shape(), &Device::Cpu)?;
        let db = Tensor::from_vec(db, g.out, &Device::Cpu)?;
        let dx = match dx {
            Some(dx) => Some(Tensor::from_vec(dx, x.shape(), &Device::Cpu)?),
            None => None,
        };
        Ok((dx, Some(dk), Some(db)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// im2col then col2im of all ones counts how many windows read each
    /// input position, which for a 3x3 kernel, padding 1, on 3x3 is known.
    #[test]
    fn col2im_counts_the_windows_reading_each_pixel() {
        let g = Geometry::new((1, 3, 3, 2), 3, 1, 1).unwrap();
        let x: Vec<f32> = (0..18).map(|v| v as f32 + 1.0).collect();
        let mut cols = vec![f32::NAN; g.pixels() * g.width()];
        g.im2col(&x, 0..g.oh(), &mut cols, g.width());
        // The centre window reads the whole image, in (ky, kx, ch) order.
        assert_eq!(&cols[4 * 18..5 * 18], &x[..]);
        // The corner window (0, 0) reads padding in its first row and column.
        assert_eq!(&cols[..6], &[0.0; 6]);
        assert_eq!(&cols[6..8], &[0.0, 0.0]);
        assert_eq!(&cols[8..12], &x[..4]);
        let mut dx = vec![0f32; 18];
        g.col2im(&vec![1.0; cols.len()], 0..g.oh(), &mut dx);
        let per_pixel = [4.0, 6.0, 4.0, 6.0, 9.0, 6.0, 4.0, 6.0, 4.0];
        let expected: Vec<f32> = per_pixel.iter().flat_map(|&v| [v, v]).collect();
        assert_eq!(dx, expected);
    }

    /// The column-major im2col (the forward pass's) is the row-major one
    /// (the backward pass's) transposed, padding and edge windows included,
    /// for one channel and for several; the row-major one's padded columns
    /// are zeros.
    #[test]
    fn the_column_major_im2col_is_the_transpose_of_the_row_major_one() {
        for c in [1, 3, 5, 6] {
            for (k, pad) in [(5, 2), (3, 0), (2, 3), (4, 1)] {
                let g = Geometry::new((3, 6, 7, c), k, pad, 2).unwrap();
                let x: Vec<f32> = (0..3 * 6 * 7 * c).map(|v| v as f32 + 1.0).collect();
                let (rows, width, stride) = (3 * g.pixels(), g.width(), g.padded_width());
                assert!(stride >= width && stride % GEMM_LANES == 0);
                let mut row_major = vec![f32::NAN; rows * stride];
                g.im2col(&x, 0..3 * g.oh(), &mut row_major, stride);
                let mut col_major = vec![f32::NAN; rows * width];
                g.im2col_t(&x, 0..3 * g.oh(), &mut col_major);
                for r in 0..rows {
                    for j in 0..width {
                        assert_eq!(
                            col_major[j * rows + r],
                            row_major[r * stride + j],
                            "c {c} k {k} pad {pad}: row {r} column {j}"
                        );
                    }
                    assert!(
                        row_major[r * stride + width..(r + 1) * stride]
                            .iter()
                            .all(|&v| v == 0.0)
                    );
                }
            }
        }
    }

    #[test]
    fn repack_and_unpack_are_inverse() {
        let g = Geometry::new((1, 5, 5, 3), 2, 0, 4).unwrap();
        let kernel: Vec<f32> = (0..4 * 3 * 2 * 2).map(|v| v as f32).collect();
        let wk = g.repack(&kernel);
        // Output 0, (ky, kx) = (0, 1), channel 2 is kernel[0, 2, 0, 1].
        assert_eq!(wk[3 + 2], kernel[2 * 4 + 1]);
        assert_eq!(g.unpack(&wk), kernel);
    }

    #[test]
    fn a_kernel_larger_than_the_padded_input_is_refused() {
        assert!(Geometry::new((1, 2, 2, 1), 5, 1, 1).is_err());
        assert!(Geometry::new((1, 2, 2, 1), 0, 1, 1).is_err());
        let g = Geometry::new((1, 2, 2, 1), 5, 2, 1).unwrap();
        assert_eq!((g.oh(), g.ow()), (2, 2));
    }
}
