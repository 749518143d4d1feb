//! The direct convolution: for layers with few values per window and few
//! outputs over wide images (a CNN's first layer: 5x5 over 1 or 3 channels
//! into 6), where im2col + GEMM moves far more memory than it multiplies.
//!
//! LeNet's first layer at batch 64 has a 50,176 x 25 im2col matrix (5 MB)
//! for a GEMM of 25-long dot products into 6 columns; at 64x64x3 the
//! matrix is 79 MB. Writing and reading that matrix cost more than the
//! multiplies (`examples/op_times`; the numbers are in
//! `docs/benchmarks.md`, "The direct convolution"). Here each image is
//! copied once into zero-padded planes (one per input channel, a few KB),
//! and each output line is computed in chunks of [`CHUNK`] pixels: for
//! every tap `(channel, ky, kx)` of the kernel, the chunk of the plane's
//! line `oy + ky` shifted by `kx`, times the tap's weight, is added into
//! [`GROUP`] output channels' accumulators at once. The accumulators stay
//! in registers; nothing batch-sized is written except the output.
//!
//! Backward computes `db` and `dW` the same way round: for each tap, the
//! gradient's chunks (laid out channel-major per image, ReLU mask applied)
//! times the plane's shifted chunks, summed lane-wise over the run and
//! across lanes once at its end; with AVX-512 a whole kernel row of taps
//! at once, so that each gradient chunk is loaded once per row. `dx` is not
//! computed here (a first layer's input is the data): a caller that needs
//! it uses the im2col path.
//!
//! Lanes past the output's width (in a line's last chunk) compute values
//! that are never stored; in backward the plane's values there are masked
//! to zero, so an input outside a tap's windows never reaches its `dW`
//! (an infinite one would otherwise make NaN from zero times infinity).
//!
//! The loops are plain Rust over fixed-size arrays, compiled three times
//! (AVX-512, AVX2 + FMA, the baseline); the best the CPU has is picked at
//! run time, as `gemm` does, so that each chunk becomes two 512-bit or four
//! 256-bit vectors and `mul_add` one FMA instruction. The results differ
//! between the three in the last bits only (FMA rounds once).

use super::conv::Geometry;

/// f32 values per SIMD chunk of an output line: two AVX-512 vectors.
pub(super) const CHUNK: usize = 32;

/// Output channels computed together: each chunk of input is loaded once
/// for this many outputs' accumulators.
const GROUP: usize = 3;

/// An instruction set the kernels run with: only [`Isa::best`] (and, in
/// tests, [`Isa::available`]) make one, so a value is always one the CPU
/// can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Isa(Level);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Plain,
}

impl Level {
    /// Every level the kernels are compiled for, the baseline first.
    const ALL: &[Level] = &[
        Level::Plain,
        #[cfg(target_arch = "x86_64")]
        Level::Avx2,
        #[cfg(target_arch = "x86_64")]
        Level::Avx512,
    ];

    /// Whether this CPU can run code compiled for the level (`std` caches
    /// the detection).
    fn supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        use std::arch::is_x86_feature_detected as has;
        match self {
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => has!("avx512f") && has!("fma"),
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => has!("avx2") && has!("fma"),
            Level::Plain => true,
        }
    }
}

impl Isa {
    /// The best instruction set this CPU has.
    pub fn best() -> Isa {
        let best = Level::ALL.iter().rev().find(|level| level.supported());
        Isa(best.copied().unwrap_or(Level::Plain))
    }

    /// Every instruction set this CPU has, the baseline included.
    #[cfg(test)]
    pub fn available() -> Vec<Isa> {
        let levels = Level::ALL.iter().filter(|level| level.supported());
        levels.map(|&level| Isa(level)).collect()
    }
}

/// One image's zero-padded planes: plane `ch`, line `y`, column `x` at
/// `(ch * lines + y) * stride + x`, the input pixel `(y - pad, x - pad)`.
/// `stride` is wide enough for the last chunk of every line at every `kx`.
pub(super) struct Planes {
    channels: usize,
    lines: usize,
    stride: usize,
}

impl Planes {
    pub fn new(g: &Geometry) -> Planes {
        Planes {
            channels: g.c,
            lines: g.h + 2 * g.pad,
            stride: g.ow().next_multiple_of(CHUNK) + g.k - 1,
        }
    }

    /// The values of one image's planes.
    pub fn len(&self) -> usize {
        self.channels * self.lines * self.stride
    }

    /// The offset of tap `(ch, ky, kx)` from the start of an output line's
    /// first chunk.
    fn tap(&self, ch: usize, ky: usize, kx: usize) -> usize {
        (ch * self.lines + ky) * self.stride + kx
    }

    /// Copies one NHWC image into `planes` (every value written).
    pub fn fill(&self, g: &Geometry, image: &[f32], planes: &mut [f32]) {
        planes.fill(0.0);
        for (iy, row) in image.chunks_exact(g.w * g.c).enumerate() {
            let at = (iy + g.pad) * self.stride + g.pad;
            for (ix, pixel) in row.chunks_exact(g.c).enumerate() {
                for (ch, &v) in pixel.iter().enumerate() {
                    planes[ch * self.lines * self.stride + at + ix] = v;
                }
            }
        }
    }
}

/// The taps of one group of output channels: each tap's plane offset and
/// its weights for the group's outputs (zeros past the group's end).
struct Taps {
    offsets: Vec<usize>,
    weights: Vec<[f32; GROUP]>,
}

/// The taps of output channels `first..first + GROUP` (those that exist) of
/// candle's kernel `[out, c, k, k]`.
fn taps(g: &Geometry, p: &Planes, kernel: &[f32], first: usize) -> Taps {
    let (k, c) = (g.k, g.c);
    let mut t = Taps {
        offsets: Vec::with_capacity(c * k * k),
        weights: Vec::with_capacity(c * k * k),
    };
    for ch in 0..c {
        for ky in 0..k {
            for kx in 0..k {
                t.offsets.push(p.tap(ch, ky, kx));
                t.weights.push(std::array::from_fn(|j| {
                    let o = first + j;
                    if o < g.out {
                        kernel[((o * c + ch) * k + ky) * k + kx]
                    } else {
                        0.0
                    }
                }));
            }
        }
    }
    t
}

/// Every group's taps.
fn all_taps(g: &Geometry, p: &Planes, kernel: &[f32]) -> Vec<Taps> {
    (0..g.out)
        .step_by(GROUP)
        .map(|first| taps(g, p, kernel, first))
        .collect()
}

/// `acc + a * b`, fused where the CPU has FMA (it is then one instruction;
/// without FMA, `mul_add` would be a library call).
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, acc: f32) -> f32 {
    if FMA { a.mul_add(b, acc) } else { acc + a * b }
}

/// A layer's parameters: candle's kernel `[out, c, k, k]`, the bias, and
/// whether a ReLU follows.
pub(super) struct Layer<'a> {
    pub kernel: &'a [f32],
    pub bias: &'a [f32],
    pub relu: bool,
}

/// What the forward pass needs for every image of a call.
struct Forward<'a> {
    g: &'a Geometry,
    planes: Planes,
    /// Each group of outputs' taps.
    taps: Vec<Taps>,
    bias: &'a [f32],
    relu: bool,
}

/// The forward pass over a run of images (NHWC `x`, `y`), `planes` being
/// scratch of [`Planes::len`] values.
pub(super) fn forward_run(
    isa: Isa,
    g: &Geometry,
    layer: &Layer,
    (x, y): (&[f32], &mut [f32]),
    planes: &mut [f32],
) {
    let p = Planes::new(g);
    let f = Forward {
        g,
        taps: all_taps(g, &p, layer.kernel),
        planes: p,
        bias: layer.bias,
        relu: layer.relu,
    };
    let images = x.chunks_exact(g.h * g.w * g.c);
    let outputs = y.chunks_exact_mut(g.oh() * g.ow() * g.out);
    for (image, out) in images.zip(outputs) {
        f.planes.fill(g, image, planes);
        dispatch_forward(isa, &f, planes, out);
    }
}

/// Runs [`forward_image`] compiled for `isa`.
fn dispatch_forward(isa: Isa, f: &Forward, planes: &[f32], y: &mut [f32]) {
    match isa.0 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: an `Isa` of this level exists only where the CPU has it.
        Level::Avx512 => unsafe { forward_image_avx512(f, planes, y) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Level::Avx2 => unsafe { forward_image_avx2(f, planes, y) },
        Level::Plain => forward_image::<false>(f, planes, y),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
fn forward_image_avx512(f: &Forward, planes: &[f32], y: &mut [f32]) {
    forward_image::<true>(f, planes, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn forward_image_avx2(f: &Forward, planes: &[f32], y: &mut [f32]) {
    forward_image::<true>(f, planes, y)
}

/// One image's output lines, chunk by chunk, group by group.
#[inline(always)]
fn forward_image<const FMA: bool>(f: &Forward, planes: &[f32], y: &mut [f32]) {
    let (ow, out) = (f.g.ow(), f.g.out);
    for oy in 0..f.g.oh() {
        let line = &mut y[oy * ow * out..][..ow * out];
        for x0 in (0..ow).step_by(CHUNK) {
            let base = oy * f.planes.stride + x0;
            let width = CHUNK.min(ow - x0);
            for (group, t) in f.taps.iter().enumerate() {
                let acc = chunk_sums::<FMA>(t, planes, base);
                let first = group * GROUP;
                for (j, sums) in acc.iter().enumerate().take(out - first) {
                    let o = first + j;
                    for (i, &s) in sums[..width].iter().enumerate() {
                        let v = s + f.bias[o];
                        line[(x0 + i) * out + o] = if f.relu { v.max(0.0) } else { v };
                    }
                }
            }
        }
    }
}

/// The sums over a group's taps of weight times the plane chunk at
/// `base + offset`: one [`CHUNK`] of output values per output channel.
#[inline(always)]
fn chunk_sums<const FMA: bool>(t: &Taps, planes: &[f32], base: usize) -> [[f32; CHUNK]; GROUP] {
    let mut acc = [[0f32; CHUNK]; GROUP];
    for (&offset, w) in t.offsets.iter().zip(&t.weights) {
        let xs: &[f32; CHUNK] = planes[base + offset..][..CHUNK]
            .try_into()
            .expect("a chunk is CHUNK values");
        for (a, &wj) in acc.iter_mut().zip(w) {
            for (s, &v) in a.iter_mut().zip(xs) {
                *s = madd::<FMA>(v, wj, *s);
            }
        }
    }
    acc
}

/// The backward pass's scratch for one image: the planes and the
/// gradient (after the ReLU mask) channel-major, each line padded to whole
/// chunks with zeros.
pub(super) struct GradScratch<'a> {
    pub planes: &'a mut [f32],
    pub grad: &'a mut [f32],
}

/// Values [`GradScratch::grad`] needs: a plane of `oh` lines of whole
/// chunks per output, for whole groups of outputs.
pub(super) fn grad_len(g: &Geometry) -> usize {
    g.out.next_multiple_of(BACK_GROUP) * g.oh() * g.ow().next_multiple_of(CHUNK)
}

/// Output channels whose `dW` the backward pass computes together.
const BACK_GROUP: usize = 2;

/// `dW` (candle's `[out, c, k, k]` order) and `db` of a run of images,
/// from its input `x`, output `res` (for the ReLU mask) and gradient.
pub(super) fn backward_run(
    isa: Isa,
    g: &Geometry,
    x: &[f32],
    relu: bool,
    res: &[f32],
    grad: &[f32],
    scratch: GradScratch,
) -> (Vec<f32>, Vec<f32>) {
    let p = Planes::new(g);
    let mut sums = vec![[0f32; CHUNK]; g.out * c_k_k(g)];
    let mut db = vec![0f32; g.out];
    let image_out = g.oh() * g.ow() * g.out;
    let images = x.chunks_exact(g.h * g.w * g.c);
    let outputs = res
        .chunks_exact(image_out)
        .zip(grad.chunks_exact(image_out));
    for (image, (r, gr)) in images.zip(outputs) {
        p.fill(g, image, scratch.planes);
        masked_channel_major(g, relu, r, gr, scratch.grad, &mut db);
        dispatch_backward(isa, g, &p, scratch.planes, scratch.grad, &mut sums);
    }
    let dw = sums.iter().map(|lanes| lanes.iter().sum()).collect();
    (dw, db)
}

/// Taps per output channel: `c * k * k`.
fn c_k_k(g: &Geometry) -> usize {
    g.c * g.k * g.k
}

/// The gradient of one image before the ReLU (zero where the output was
/// clipped), channel-major with lines padded to whole chunks by zeros;
/// adds each channel's sum to `db`.
fn masked_channel_major(
    g: &Geometry,
    relu: bool,
    res: &[f32],
    grad: &[f32],
    out: &mut [f32],
    db: &mut [f32],
) {
    let (ow, outs) = (g.ow(), g.out);
    let line = ow.next_multiple_of(CHUNK);
    let per_out = g.oh() * line;
    out.fill(0.0);
    let lines = res
        .chunks_exact(ow * outs)
        .zip(grad.chunks_exact(ow * outs));
    for (oy, (rs, gs)) in lines.enumerate() {
        for (ox, (r, gv)) in rs.chunks_exact(outs).zip(gs.chunks_exact(outs)).enumerate() {
            for (o, (&r, &gv)) in r.iter().zip(gv).enumerate() {
                out[o * per_out + oy * line + ox] = if relu { pass_if(r > 0.0, gv) } else { gv };
            }
        }
    }
    for (d, plane) in db.iter_mut().zip(out.chunks_exact(per_out)) {
        *d += lane_sum(plane);
    }
}

/// `v` if `keep`, else 0, without a branch (the ReLU mask is as good as
/// random, and a branch on it mispredicted half the time).
#[inline(always)]
fn pass_if(keep: bool, v: f32) -> f32 {
    std::hint::select_unpredictable(keep, v, 0.0)
}

/// The sum of `values` (a whole number of chunks) in [`CHUNK`] lanes, then
/// across them.
fn lane_sum(values: &[f32]) -> f32 {
    let mut lanes = [0f32; CHUNK];
    for chunk in values.chunks_exact(CHUNK) {
        for (l, &v) in lanes.iter_mut().zip(chunk) {
            *l += v;
        }
    }
    lanes.iter().sum()
}

/// Runs [`backward_image`] compiled for `isa`, adding into `sums` (a
/// [`CHUNK`] of lane-wise partial sums per `dW` entry).
fn dispatch_backward(
    isa: Isa,
    g: &Geometry,
    p: &Planes,
    planes: &[f32],
    grad: &[f32],
    sums: &mut [[f32; CHUNK]],
) {
    match isa.0 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: an `Isa` of this level exists only where the CPU has it.
        Level::Avx512 => unsafe { backward_image_avx512(g, p, planes, grad, sums) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Level::Avx2 => unsafe { backward_image_avx2(g, p, planes, grad, sums) },
        Level::Plain => backward_image::<false, 1>(g, p, planes, grad, sums),
    }
}

/// With 32 vector registers, a whole row of a 5x5 or 3x3 kernel at once.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
fn backward_image_avx512(
    g: &Geometry,
    p: &Planes,
    planes: &[f32],
    grad: &[f32],
    sums: &mut [[f32; CHUNK]],
) {
    match g.k {
        5 => backward_image::<true, 5>(g, p, planes, grad, sums),
        3 => backward_image::<true, 3>(g, p, planes, grad, sums),
        _ => backward_image::<true, 1>(g, p, planes, grad, sums),
    }
}

/// With 16 vector registers of half the width, one tap at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn backward_image_avx2(
    g: &Geometry,
    p: &Planes,
    planes: &[f32],
    grad: &[f32],
    sums: &mut [[f32; CHUNK]],
) {
    backward_image::<true, 1>(g, p, planes, grad, sums)
}

/// Adds one image's products into `sums`: for each pair of output
/// channels and each run of `KX` taps along a kernel row, the gradient's
/// chunks times the plane's chunks at the taps' offsets, over every
/// output line; each gradient chunk is loaded once for the `KX` taps and
/// each plane chunk once for the pair. `KX` divides `k` (1 always does).
#[inline(always)]
fn backward_image<const FMA: bool, const KX: usize>(
    g: &Geometry,
    p: &Planes,
    planes: &[f32],
    grad: &[f32],
    sums: &mut [[f32; CHUNK]],
) {
    let (k, taps) = (g.k, c_k_k(g));
    let line = g.ow().next_multiple_of(CHUNK);
    let per_out = g.oh() * line;
    let edge = edge_mask(g.ow());
    for (group, gs) in grad.chunks_exact(BACK_GROUP * per_out).enumerate() {
        let gs: [&[f32]; BACK_GROUP] = std::array::from_fn(|j| &gs[j * per_out..][..per_out]);
        let first = group * BACK_GROUP;
        for ch in 0..g.c {
            for ky in 0..k {
                for kx in (0..k).step_by(KX) {
                    let offset = p.tap(ch, ky, kx);
                    let acc = row_sums::<FMA, KX>(gs, planes, offset, p.stride, line, &edge);
                    for (j, acc) in acc.iter().enumerate().take(g.out - first) {
                        let entry = (first + j) * taps + (ch * k + ky) * k + kx;
                        for (sum, lanes) in sums[entry..entry + KX].iter_mut().zip(acc) {
                            add_lanes(sum, lanes);
                        }
                    }
                }
            }
        }
    }
}

#[inline(always)]
fn add_lanes(acc: &mut [f32; CHUNK], v: &[f32; CHUNK]) {
    for (a, &b) in acc.iter_mut().zip(v) {
        *a += b;
    }
}

/// The bit mask that keeps the lanes of a line's last chunk inside an
/// output `ow` wide, and zeroes the rest.
fn edge_mask(ow: usize) -> [u32; CHUNK] {
    let valid = ow - (ow.next_multiple_of(CHUNK) - CHUNK);
    std::array::from_fn(|l| if l < valid { u32::MAX } else { 0 })
}

/// For each gradient of a pair and each of `KX` taps from `offset` on,
/// lane-wise sums of gradient chunk times plane chunk over an image's
/// output lines. The plane's values in lanes past the output's width are
/// masked to zero (the gradient there is zero already): they are inputs
/// the tap's windows never read, and an infinite one would make zero
/// times infinity, NaN.
#[inline(always)]
fn row_sums<const FMA: bool, const KX: usize>(
    gs: [&[f32]; BACK_GROUP],
    planes: &[f32],
    offset: usize,
    stride: usize,
    line: usize,
    edge: &[u32; CHUNK],
) -> [[[f32; CHUNK]; KX]; BACK_GROUP] {
    let last = line - CHUNK;
    let lines = gs[0].len() / line;
    let mut acc = [[[0f32; CHUNK]; KX]; BACK_GROUP];
    for oy in 0..lines {
        let xline = &planes[oy * stride + offset..][..line + KX - 1];
        let gline: [&[f32]; BACK_GROUP] = gs.map(|gj| &gj[oy * line..][..line]);
        for x0 in (0..last).step_by(CHUNK) {
            chunk_products::<FMA, KX>(&mut acc, gline, xline, x0, None);
        }
        chunk_products::<FMA, KX>(&mut acc, gline, xline, last, Some(edge));
    }
    acc
}

/// `acc[j][t] += gline[j][x0..][..CHUNK] * xline[x0 + t..][..CHUNK]`,
/// lane-wise, the plane's chunk masked by `mask` where given.
#[inline(always)]
fn chunk_products<const FMA: bool, const KX: usize>(
    acc: &mut [[[f32; CHUNK]; KX]; BACK_GROUP],
    gline: [&[f32]; BACK_GROUP],
    xline: &[f32],
    x0: usize,
    mask: Option<&[u32; CHUNK]>,
) {
    let gv: [&[f32; CHUNK]; BACK_GROUP] =
        gline.map(|gj| gj[x0..][..CHUNK].try_into().expect("CHUNK values"));
    for t in 0..KX {
        let mut xs: [f32; CHUNK] = xline[x0 + t..][..CHUNK].try_into().expect("CHUNK values");
        if let Some(mask) = mask {
            for (v, &m) in xs.iter_mut().zip(mask) {
                *v = f32::from_bits(v.to_bits() & m);
            }
        }
        for (a, g) in acc.iter_mut().zip(gv) {
            for ((s, &gl), &xl) in a[t].iter_mut().zip(g).zip(&xs) {
                *s = madd::<FMA>(gl, xl, *s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::values;
    use super::*;

    /// The input value at padded coordinates, if inside the image.
    fn at(g: &Geometry, x: &[f32], n: usize, y: usize, xx: usize, ch: usize) -> Option<f32> {
        let (iy, ix) = (y.checked_sub(g.pad)?, xx.checked_sub(g.pad)?);
        (iy < g.h && ix < g.w).then(|| x[((n * g.h + iy) * g.w + ix) * g.c + ch])
    }

    /// The convolution by its definition, in f64, over the products of
    /// real input values only (padding contributes nothing).
    fn reference_forward(g: &Geometry, x: &[f32], kernel: &[f32], bias: &[f32]) -> Vec<f32> {
        let (k, c) = (g.k, g.c);
        let mut y = Vec::new();
        for n in 0..g.b {
            for oy in 0..g.oh() {
                for ox in 0..g.ow() {
                    for (o, &b) in bias.iter().enumerate() {
                        let mut s = b as f64;
                        for ch in 0..c {
                            for ky in 0..k {
                                for kx in 0..k {
                                    if let Some(v) = at(g, x, n, oy + ky, ox + kx, ch) {
                                        let w = kernel[((o * c + ch) * k + ky) * k + kx];
                                        s += w as f64 * v as f64;
                                    }
                                }
                            }
                        }
                        y.push(s as f32);
                    }
                }
            }
        }
        y
    }

    /// `dW` and `db` by their definition, from the gradient `gm` after
    /// the ReLU mask.
    fn reference_backward(g: &Geometry, x: &[f32], gm: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let (k, c) = (g.k, g.c);
        let mut dw = vec![0f64; g.out * c * k * k];
        let mut db = vec![0f64; g.out];
        for n in 0..g.b {
            for oy in 0..g.oh() {
                for ox in 0..g.ow() {
                    for o in 0..g.out {
                        let gv = gm[((n * g.oh() + oy) * g.ow() + ox) * g.out + o] as f64;
                        db[o] += gv;
                        for ch in 0..c {
                            for ky in 0..k {
                                for kx in 0..k {
                                    if let Some(v) = at(g, x, n, oy + ky, ox + kx, ch) {
                                        dw[((o * c + ch) * k + ky) * k + kx] += gv * v as f64;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        let f = |v: Vec<f64>| v.into_iter().map(|v| v as f32).collect();
        (f(dw), f(db))
    }

    /// Equal within `tol` relative, or the same non-finite value.
    fn assert_close(what: &str, a: &[f32], b: &[f32], tol: f32) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
            let same = if y.is_finite() {
                (x - y).abs() <= tol * (1.0 + y.abs())
            } else {
                x.is_nan() == y.is_nan() && (y.is_nan() || x == y)
            };
            assert!(same, "{what} at {i}: {x} against {y}");
        }
    }

    /// Runs the direct forward and backward with `isa` and returns
    /// `(y, dW, db)` for the gradient `grad`.
    fn direct(
        isa: Isa,
        g: &Geometry,
        x: &[f32],
        kernel: &[f32],
        bias: &[f32],
        relu: bool,
        grad: &[f32],
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut planes = vec![f32::NAN; Planes::new(g).len()];
        let mut y = vec![f32::NAN; g.b * g.oh() * g.ow() * g.out];
        let layer = Layer { kernel, bias, relu };
        forward_run(isa, g, &layer, (x, &mut y), &mut planes);
        let mut gbuf = vec![f32::NAN; grad_len(g)];
        let scratch = GradScratch {
            planes: &mut planes,
            grad: &mut gbuf,
        };
        let (dw, db) = backward_run(isa, g, x, relu, &y, grad, scratch);
        (y, dw, db)
    }

    /// Every instruction set computes the definition, for outputs narrower
    /// than a chunk, exactly one chunk, and several with a partial last
    /// one; one to three channels; output counts that fill the last group
    /// of outputs or not; with and without the ReLU.
    #[test]
    fn every_instruction_set_computes_the_definition() {
        let shapes = [
            ((2, 5, 7, 1), 3, 1, 4),
            ((2, 4, 40, 3), 5, 2, 7),
            ((1, 3, 32, 2), 3, 1, 3),
            ((1, 6, 70, 1), 2, 0, 1),
            ((3, 5, 5, 1), 5, 0, 2),
            ((2, 28, 28, 1), 5, 2, 6),
        ];
        for (i, (dims, k, pad, out)) in shapes.into_iter().enumerate() {
            let g = Geometry::new(dims, k, pad, out).unwrap();
            let seed = 10 * i as u64;
            let x = values(g.b * g.h * g.w * g.c, seed + 1);
            let kernel = values(out * g.c * k * k, seed + 2);
            let bias = values(out, seed + 3);
            let grad = values(g.b * g.oh() * g.ow() * out, seed + 4);
            for relu in [false, true] {
                let mut expected = reference_forward(&g, &x, &kernel, &bias);
                if relu {
                    expected.iter_mut().for_each(|v| *v = v.max(0.0));
                }
                let gm: Vec<f32> = grad
                    .iter()
                    .zip(&expected)
                    .map(|(&gv, &r)| if !relu || r > 0.0 { gv } else { 0.0 })
                    .collect();
                let (dw, db) = reference_backward(&g, &x, &gm);
                for isa in Isa::available() {
                    let what = format!("{dims:?} k {k} pad {pad} out {out} relu {relu} {isa:?}");
                    let (y, gw, gb) = direct(isa, &g, &x, &kernel, &bias, relu, &grad);
                    assert_close(&format!("{what}: y"), &y, &expected, 1e-5);
                    assert_close(&format!("{what}: dW"), &gw, &dw, 1e-4);
                    assert_close(&format!("{what}: db"), &gb, &db, 1e-5);
                }
            }
        }
    }

    /// Lanes past an output line's end read input columns that the tap's
    /// windows never do; an infinite value there must not reach that tap's
    /// `dW` (as NaN from zero times infinity), while the taps whose windows
    /// read it get what the definition gives.
    #[test]
    fn an_input_no_window_of_a_tap_reads_never_reaches_its_gradient() {
        let g = Geometry::new((1, 4, 28, 1), 5, 2, 2).unwrap();
        let mut x = values(g.h * g.w, 7);
        // Column 27, the last: read by kx >= 2 only (ox = 27 + 2 - kx).
        x[2 * g.w + 27] = f32::INFINITY;
        let kernel = values(2 * 25, 8);
        let bias = values(2, 9);
        let grad = values(g.oh() * g.ow() * 2, 10);
        let (dw, _) = reference_backward(&g, &x, &grad);
        // Output 0, ky 2 (output line 2 reads input line 2 there).
        let tap = |kx: usize| 2 * 5 + kx;
        assert!(
            dw[tap(0)].is_finite() && dw[tap(1)].is_finite(),
            "kx 0 and 1 never read it"
        );
        assert!(!dw[tap(4)].is_finite(), "kx 4 reads it");
        for isa in Isa::available() {
            let (_, gw, _) = direct(isa, &g, &x, &kernel, &bias, false, &grad);
            assert_close(&format!("{isa:?}"), &gw, &dw, 1e-4);
        }
    }
}
