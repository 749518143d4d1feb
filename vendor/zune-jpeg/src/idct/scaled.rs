/*
 * tfpipe patch (not in upstream zune-jpeg): the reduced IDCTs of
 * DCT-scaled decoding, ported from the Independent JPEG Group's jidctred.c
 * (jpeg_idct_4x4, jpeg_idct_2x2, jpeg_idct_1x1; Copyright (C) 1994-1998,
 * Thomas G. Lane, used under the IJG license), which libjpeg-turbo, and so
 * TensorFlow's `decode_jpeg(ratio=2|4|8)`, uses for scale_denom 2, 4, 8.
 * Same constants and rounding, in i64 so that no coefficient of a corrupt
 * stream can overflow. Coefficients come dequantized, in natural order.
 */

//! The reduced IDCTs of DCT-scaled decoding (tfpipe patch, from jidctred.c).

const CONST_BITS: u32 = 13;
const PASS1_BITS: u32 = 2;

const FIX_0_211164243: i64 = 1730;
const FIX_0_509795579: i64 = 4176;
const FIX_0_601344887: i64 = 4926;
const FIX_0_720959822: i64 = 5906;
const FIX_0_765366865: i64 = 6270;
const FIX_0_850430095: i64 = 6967;
const FIX_0_899976223: i64 = 7373;
const FIX_1_061594337: i64 = 8697;
const FIX_1_272758580: i64 = 10426;
const FIX_1_451774981: i64 = 11893;
const FIX_1_847759065: i64 = 15137;
const FIX_2_172734803: i64 = 17799;
const FIX_2_562915447: i64 = 20995;
const FIX_3_624509785: i64 = 29692;

/// `x` divided by `2^n`, rounded (libjpeg's DESCALE).
fn descale(x: i64, n: u32) -> i64 {
    (x + (1 << (n - 1))) >> n
}

/// A level-shifted output sample, clamped (libjpeg's range_limit).
#[allow(clippy::cast_possible_truncation)]
fn sample(x: i64) -> i16 {
    (x + 128).clamp(0, 255) as i16
}

/// Writes the `n x n` (n = 1, 2 or 4) pixels of the block whose
/// coefficients are `coeffs` to `out`, rows `stride` apart.
pub fn idct_scaled(coeffs: &[i32; 64], out: &mut [i16], stride: usize, n: usize) {
    match n {
        4 => idct_4x4(coeffs, out, stride),
        2 => idct_2x2(coeffs, out, stride),
        _ => out[0] = sample(descale(i64::from(coeffs[0]), 3)),
    }
}

/// The odd part of jpeg_idct_4x4 from the values at 1, 3, 5, 7 of a line.
fn odd_4(z4: i64, z3: i64, z2: i64, z1: i64) -> (i64, i64) {
    let tmp0 = z1 * -FIX_0_211164243 + z2 * FIX_1_451774981 + z3 * -FIX_2_172734803
        + z4 * FIX_1_061594337;
    let tmp2 = z1 * -FIX_0_509795579 + z2 * -FIX_0_601344887 + z3 * FIX_0_899976223
        + z4 * FIX_2_562915447;
    (tmp0, tmp2)
}

fn idct_4x4(c: &[i32; 64], out: &mut [i16], stride: usize) {
    let at = |i: usize| i64::from(c[i]);
    let mut ws = [0_i64; 8 * 4];
    // Pass 1: columns (column 4 is not used by pass 2).
    for col in (0..8).filter(|&col| col != 4) {
        if [1, 2, 3, 5, 6, 7].iter().all(|r| c[r * 8 + col] == 0) {
            let dc = at(col) << PASS1_BITS;
            for row in 0..4 {
                ws[row * 8 + col] = dc;
            }
            continue;
        }
        let tmp0 = at(col) << (CONST_BITS + 1);
        let tmp2 = at(16 + col) * FIX_1_847759065 + at(48 + col) * -FIX_0_765366865;
        let (tmp10, tmp12) = (tmp0 + tmp2, tmp0 - tmp2);
        let (tmp0, tmp2) = odd_4(at(8 + col), at(24 + col), at(40 + col), at(56 + col));
        let shift = CONST_BITS - PASS1_BITS + 1;
        ws[col] = descale(tmp10 + tmp2, shift);
        ws[24 + col] = descale(tmp10 - tmp2, shift);
        ws[8 + col] = descale(tmp12 + tmp0, shift);
        ws[16 + col] = descale(tmp12 - tmp0, shift);
    }
    // Pass 2: the 4 rows.
    for row in 0..4 {
        let w = &ws[row * 8..row * 8 + 8];
        let tmp0 = w[0] << (CONST_BITS + 1);
        let tmp2 = w[2] * FIX_1_847759065 + w[6] * -FIX_0_765366865;
        let (tmp10, tmp12) = (tmp0 + tmp2, tmp0 - tmp2);
        let (tmp0, tmp2) = odd_4(w[1], w[3], w[5], w[7]);
        let shift = CONST_BITS + PASS1_BITS + 3 + 1;
        let line = &mut out[row * stride..row * stride + 4];
        line[0] = sample(descale(tmp10 + tmp2, shift));
        line[3] = sample(descale(tmp10 - tmp2, shift));
        line[1] = sample(descale(tmp12 + tmp0, shift));
        line[2] = sample(descale(tmp12 - tmp0, shift));
    }
}

/// The odd part of jpeg_idct_2x2 from the values at 1, 3, 5, 7 of a line.
fn odd_2(z1: i64, z3: i64, z5: i64, z7: i64) -> i64 {
    z7 * -FIX_0_720959822 + z5 * FIX_0_850430095 + z3 * -FIX_1_272758580 + z1 * FIX_3_624509785
}

fn idct_2x2(c: &[i32; 64], out: &mut [i16], stride: usize) {
    let at = |i: usize| i64::from(c[i]);
    let mut ws = [0_i64; 8 * 2];
    // Pass 1: columns 0, 1, 3, 5, 7 (the others are not used by pass 2).
    for col in [0, 1, 3, 5, 7] {
        if [1, 3, 5, 7].iter().all(|r| c[r * 8 + col] == 0) {
            let dc = at(col) << PASS1_BITS;
            ws[col] = dc;
            ws[8 + col] = dc;
            continue;
        }
        let tmp10 = at(col) << (CONST_BITS + 2);
        let tmp0 = odd_2(at(8 + col), at(24 + col), at(40 + col), at(56 + col));
        let shift = CONST_BITS - PASS1_BITS + 2;
        ws[col] = descale(tmp10 + tmp0, shift);
        ws[8 + col] = descale(tmp10 - tmp0, shift);
    }
    // Pass 2: the 2 rows.
    for row in 0..2 {
        let w = &ws[row * 8..row * 8 + 8];
        let tmp10 = w[0] << (CONST_BITS + 2);
        let tmp0 = odd_2(w[1], w[3], w[5], w[7]);
        let shift = CONST_BITS + PASS1_BITS + 3 + 2;
        out[row * stride] = sample(descale(tmp10 + tmp0, shift));
        out[row * stride + 1] = sample(descale(tmp10 - tmp0, shift));
    }
}
