//! Crop windows: the centre crop of evaluation and the random crop of
//! training, as TensorFlow's reference input pipelines choose them.
//!
//! [`center_crop`] is the ResNet/EfficientNet evaluation crop
//! (`tensorflow/tpu`'s `_decode_and_center_crop`): a square of
//! `fraction` times the shorter side, centred. [`RandomCrop`] is
//! `tf.image.sample_distorted_bounding_box` with the whole image as the only
//! bounding box (TensorFlow's `GenerateRandomCrop`, attempt for attempt), and
//! the same fallback as `_decode_and_random_crop`: when no attempt fits, the
//! centre crop.
//!
//! The random draws come from a `SplitMix64` seeded per element,
//! so a window depends only on (seed, element), never on thread timing.

use super::error::ImageError;
use super::resize::Window;
use crate::rng::SplitMix64;

/// The default fraction of the shorter side kept by the centre crop:
/// 224 / (224 + 32), ResNet's evaluation crop.
pub const DEFAULT_CENTER_FRACTION: f32 = 0.875;

/// The square centre crop of `fraction` times the shorter side.
///
/// ```
/// use tfpipe::image::{center_crop, Window};
/// let w = center_crop(300, 400, 0.875);
/// assert_eq!(w, Window { top: 19, left: 69, height: 262, width: 262 });
/// ```
pub fn center_crop(height: usize, width: usize, fraction: f32) -> Window {
    let side = ((fraction * height.min(width) as f32) as usize).clamp(1, height.min(width));
    Window {
        top: (height - side).div_ceil(2),
        left: (width - side).div_ceil(2),
        height: side,
        width: side,
    }
}

/// The random crop of training (`sample_distorted_bounding_box`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomCrop {
    /// The crop's area as a fraction of the image's, `(min, max]`. By default
    /// `(0.08, 1.0)`, Inception's.
    pub area: (f32, f32),
    /// The crop's width / height. By default `(3/4, 4/3)`.
    pub aspect_ratio: (f32, f32),
    /// Draws before falling back to the centre crop. By default 10
    /// (ResNet's; TensorFlow's op defaults to 100).
    pub max_attempts: u32,
    /// The least fraction of the image a crop must cover. By default 0.1.
    pub min_object_covered: f32,
    /// The centre crop used when no attempt fits. By default
    /// [`DEFAULT_CENTER_FRACTION`].
    pub fallback_fraction: f32,
}

impl Default for RandomCrop {
    fn default() -> Self {
        RandomCrop {
            area: (0.08, 1.0),
            aspect_ratio: (0.75, 4.0 / 3.0),
            max_attempts: 10,
            min_object_covered: 0.1,
            fallback_fraction: DEFAULT_CENTER_FRACTION,
        }
    }
}

impl RandomCrop {
    /// Refuses empty or out-of-range ranges.
    pub fn check(&self) -> Result<(), ImageError> {
        let (lo, hi) = self.area;
        if !(lo > 0.0 && lo <= hi && hi <= 1.0) {
            return Err(ImageError::Config(format!(
                "random crop area range ({lo}, {hi}) must satisfy 0 < min <= max <= 1"
            )));
        }
        let (lo, hi) = self.aspect_ratio;
        if !(lo > 0.0 && lo <= hi && hi.is_finite()) {
            return Err(ImageError::Config(format!(
                "random crop aspect ratio range ({lo}, {hi}) must satisfy 0 < min <= max"
            )));
        }
        if self.max_attempts == 0 {
            return Err(ImageError::Config(
                "random crop max_attempts must be at least 1".into(),
            ));
        }
        if !(0.0..=1.0).contains(&self.min_object_covered) {
            return Err(ImageError::Config(format!(
                "min_object_covered {} must be in [0, 1]",
                self.min_object_covered
            )));
        }
        check_fraction(self.fallback_fraction)
    }

    /// The window for an image of `height x width`: a function of `seed`
    /// (see [`element_seed`](super::element_seed)) and the size alone.
    ///
    /// ```
    /// use tfpipe::image::{element_seed, RandomCrop};
    /// let crop = RandomCrop::default();
    /// let a = crop.window(375, 500, element_seed(7, 0, 12));
    /// assert_eq!(a, crop.window(375, 500, element_seed(7, 0, 12)));
    /// assert!(a.top + a.height <= 375 && a.left + a.width <= 500);
    /// ```
    pub fn window(&self, height: usize, width: usize, seed: u64) -> Window {
        let mut rng = SplitMix64(seed);
        for _ in 0..self.max_attempts {
            if let Some(window) = self.attempt(height, width, &mut rng) {
                let area = (window.height * window.width) as f32;
                let covered = area / (height * width) as f32;
                if covered >= self.min_object_covered {
                    return window;
                }
            }
        }
        center_crop(height, width, self.fallback_fraction)
    }

    /// One attempt of TensorFlow's `GenerateRandomCrop`, with its rounding.
    fn attempt(&self, height: usize, width: usize, rng: &mut SplitMix64) -> Option<Window> {
        let (h0, w0) = (height as f32, width as f32);
        let min_area = self.area.0 * w0 * h0;
        let max_area = self.area.1 * w0 * h0;
        let (lo, hi) = self.aspect_ratio;
        let aspect = rng.unit() as f32 * (hi - lo) + lo;
        let mut crop_h = (min_area / aspect).sqrt().round_ties_even() as i64;
        let mut max_h = (max_area / aspect).sqrt().round_ties_even() as i64;
        if (max_h as f32 * aspect).round_ties_even() > w0 {
            max_h = ((w0 + 0.5 - 1e-7) / aspect) as i64;
        }
        max_h = max_h.min(height as i64);
        crop_h = crop_h.min(max_h);
        if crop_h < max_h {
            crop_h += rng.below((max_h - crop_h + 1) as u64) as i64;
        }
        let width_of = |h: i64| (h as f32 * aspect).round_ties_even() as i64;
        let mut crop_w = width_of(crop_h);
        let mut area = (crop_w * crop_h) as f32;
        if area < min_area {
            crop_h += 1;
            crop_w = width_of(crop_h);
            area = (crop_w * crop_h) as f32;
        }
        if area > max_area {
            crop_h -= 1;
            crop_w = width_of(crop_h);
            area = (crop_w * crop_h) as f32;
        }
        let fits = crop_h > 0 && crop_w > 0 && crop_h <= height as i64 && crop_w <= width as i64;
        if !fits || area < min_area || area > max_area {
            return None;
        }
        let (crop_h, crop_w) = (crop_h as usize, crop_w as usize);
        let top = if crop_h < height {
            rng.below((height - crop_h) as u64) as usize
        } else {
            0
        };
        let left = if crop_w < width {
            rng.below((width - crop_w) as u64) as usize
        } else {
            0
        };
        Some(Window {
            top,
            left,
            height: crop_h,
            width: crop_w,
        })
    }
}

/// Refuses a centre-crop fraction outside `(0, 1]`.
pub(crate) fn check_fraction(fraction: f32) -> Result<(), ImageError> {
    if fraction > 0.0 && fraction <= 1.0 {
        Ok(())
    } else {
        Err(ImageError::Config(format!(
            "centre crop fraction {fraction} must be in (0, 1]"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::element_seed;

    #[test]
    fn random_windows_respect_the_ranges() {
        let crop = RandomCrop::default();
        let (height, width) = (375usize, 500usize);
        let mut fallbacks = 0;
        for position in 0..2000 {
            let w = crop.window(height, width, element_seed(3, 1, position));
            assert!(
                w.top + w.height <= height && w.left + w.width <= width,
                "{w:?}"
            );
            if w == center_crop(height, width, crop.fallback_fraction) {
                fallbacks += 1;
                continue;
            }
            let area = (w.height * w.width) as f32 / (height * width) as f32;
            assert!((0.1..=1.0).contains(&area), "{w:?}: area {area}");
            let aspect = w.width as f32 / w.height as f32;
            // Rounding the width to whole pixels moves the ratio a little.
            assert!((0.74..=1.35).contains(&aspect), "{w:?}: aspect {aspect}");
        }
        // Each attempt fails only when its area falls under 0.1 (about 2%),
        // so falling back after 10 failures is rare.
        assert!(fallbacks < 5, "{fallbacks} fallbacks");
    }

    #[test]
    fn windows_differ_between_elements_and_epochs() {
        let crop = RandomCrop::default();
        let a = crop.window(300, 300, element_seed(1, 0, 0));
        let distinct = (1..20)
            .map(|p| crop.window(300, 300, element_seed(1, 0, p)))
            .filter(|w| *w != a)
            .count();
        assert!(distinct >= 18);
        assert_ne!(a, crop.window(300, 300, element_seed(1, 1, 0)));
    }

    #[test]
    fn an_impossible_crop_falls_back_to_the_centre() {
        // A 1-pixel-high strip cannot hold a crop of aspect 1 and area >= 0.5.
        let crop = RandomCrop {
            area: (0.5, 1.0),
            aspect_ratio: (1.0, 1.0),
            ..RandomCrop::default()
        };
        let w = crop.window(1, 100, element_seed(0, 0, 0));
        assert_eq!(w, center_crop(1, 100, crop.fallback_fraction));
        assert_eq!(
            w,
            Window {
                top: 0,
                left: 50,
                height: 1,
                width: 1
            }
        );
    }

    #[test]
    fn options_are_checked() {
        assert!(RandomCrop::default().check().is_ok());
        let bad = RandomCrop {
            area: (0.5, 0.2),
            ..RandomCrop::default()
        };
        assert!(bad.check().is_err());
        let bad = RandomCrop {
            max_attempts: 0,
            ..RandomCrop::default()
        };
        assert!(bad.check().is_err());
        assert!(check_fraction(0.0).is_err());
        assert!(check_fraction(1.5).is_err());
    }
}
