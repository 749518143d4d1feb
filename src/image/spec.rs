//! The text form of [`ImageOptions`] used by feature specs
//! (`image/encoded:image:224x224x3:center,area,float32`): the size, then a
//! comma-separated list of options, each at most once.
//!
//! ```text
//! SIZE    = H "x" W "x" C           C is 1 or 3
//! OPTION  = bilinear | area | nearest          the resize method (default bilinear)
//!         | antialias                          antialias when shrinking
//!         | center | center(F)                 square centre crop of F (default 0.875) of the shorter side
//!         | uint8 | float32 | imagenet         output: uint8 (default), float32 in 0..1,
//!                                              or float32 normalised with ImageNet's mean and std
//!         | normalize(M,M,M,S,S,S)             float32 `(x/255 - M[c]) / S[c]` per channel
//!         | nhwc | nchw                        axis order (default nhwc)
//!         | max_pixels(N)                      refuse larger images (default 50000000)
//!         | random_crop | random_crop(A,B)       sample_distorted_bounding_box crop of area A..B
//!                                              (default 0.08,1) of the image
//!         | flip                               random left-right flip
//!         | brightness(D)                      random brightness delta in [-D, D) (0..1 scale)
//!         | contrast(L,U) | saturation(L,U)    random contrast / saturation factor in [L, U)
//!         | dct_scale | exact                  decode a JPEG at 1/2, 1/4 or 1/8 when its window is
//!                                              at least twice the size (default with random_crop),
//!                                              or always exactly as TensorFlow (default otherwise)
//! ```
//!
//! The random options draw from each element's seed: the parse stage
//! ([`Pipeline::parse_batches_seeded`](crate::pipeline::Pipeline::parse_batches_seeded))
//! derives it from the pipeline's seed, the epoch and the record's index in
//! the epoch.

use super::augment::{ImageLayout, OutputType};
use super::crop::{DEFAULT_CENTER_FRACTION, RandomCrop};
use super::decode::DEFAULT_MAX_PIXELS;
use super::resize::ResizeMethod;
use super::{Crop, ImageOptions};

impl ImageOptions {
    /// The options of `HxWxC` and a comma-separated option list, each
    /// option at most once:
    ///
    /// ```text
    /// SIZE    = H "x" W "x" C                      C is 1 or 3
    /// OPTION  = bilinear | area | nearest          the resize method (default bilinear)
    ///         | antialias                          antialias when shrinking
    ///         | center | center(F)                 square centre crop of F (default 0.875) of the shorter side
    ///         | uint8 | float32 | imagenet         uint8 (default), float32 in 0..1, or float32
    ///                                              normalised with ImageNet's mean and std
    ///         | normalize(M,M,M,S,S,S)             float32 `(x/255 - M[c]) / S[c]` per channel
    ///         | nhwc | nchw                        axis order (default nhwc)
    ///         | max_pixels(N)                      refuse larger images (default 50000000)
    ///         | random_crop | random_crop(A,B)       random crop of area A..B (default 0.08,1)
    ///         | flip                               random left-right flip
    ///         | brightness(D)                      random brightness delta in [-D, D)
    ///         | contrast(L,U) | saturation(L,U)    random factor in [L, U)
    ///         | dct_scale | exact                  JPEG decoded at 1/2, 1/4 or 1/8 when the window is
    ///                                              at least twice the size (default with random_crop),
    ///                                              or exactly (default otherwise)
    /// ```
    ///
    /// ```
    /// use tfpipe::image::{Crop, ImageOptions, ResizeMethod};
    /// let o = ImageOptions::from_text("224x224x3", "center,area").unwrap();
    /// assert_eq!((o.height, o.width, o.channels), (224, 224, 3));
    /// assert_eq!(o.method, ResizeMethod::Area);
    /// assert_eq!(o.crop, Crop::Center { fraction: 0.875 });
    /// assert_eq!(o.options_text(), "center,area");
    /// ```
    pub fn from_text(size: &str, options: &str) -> Result<ImageOptions, String> {
        let dims: Vec<usize> = size
            .split('x')
            .map(|d| d.trim().parse::<usize>())
            .collect::<Result<_, _>>()
            .map_err(|_| format!("invalid image size {size:?} (expected HxWxC, e.g. 224x224x3)"))?;
        let [height, width, channels] = dims[..] else {
            return Err(format!(
                "invalid image size {size:?} (expected HxWxC, e.g. 224x224x3)"
            ));
        };
        let mut o = ImageOptions::new(height, width, channels);
        let mut seen: Vec<&str> = Vec::new();
        for option in split_options(options) {
            let (word, arg) = split_call(option)?;
            let group = apply(&mut o, word, arg)?;
            if seen.contains(&group) {
                return Err(format!(
                    "image option {option:?}: the {group} is given twice"
                ));
            }
            seen.push(group);
        }
        if !seen.contains(&JPEG_SCALING) {
            // DCT scaling by default on the random-crop (training) path only.
            o.dct_scale = matches!(o.crop, Crop::Random(_));
        }
        o.check().map_err(|e| e.to_string())?;
        Ok(o)
    }

    /// The option list in the text form (empty when every option is at its
    /// default), such that [`from_text`](Self::from_text) gives these
    /// options back.
    pub fn options_text(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        match self.crop {
            Crop::None => {}
            Crop::Random(random) if random.area == RandomCrop::default().area => {
                parts.push("random_crop".into())
            }
            Crop::Random(random) => {
                parts.push(format!("random_crop({},{})", random.area.0, random.area.1))
            }
            Crop::Center { fraction } if fraction == DEFAULT_CENTER_FRACTION => {
                parts.push("center".into())
            }
            Crop::Center { fraction } => parts.push(format!("center({fraction})")),
        }
        if self.method != ResizeMethod::Bilinear {
            parts.push(self.method.name().into());
        }
        if self.antialias {
            parts.push("antialias".into());
        }
        match self.output {
            OutputType::Uint8 => {}
            o if o == OutputType::UNIT_FLOAT => parts.push("float32".into()),
            o if o == OutputType::IMAGENET => parts.push("imagenet".into()),
            OutputType::Float32 { mean, std } => parts.push(format!(
                "normalize({},{},{},{},{},{})",
                mean[0], mean[1], mean[2], std[0], std[1], std[2]
            )),
        }
        if self.layout == ImageLayout::Nchw {
            parts.push("nchw".into());
        }
        if self.max_pixels != DEFAULT_MAX_PIXELS {
            parts.push(format!("max_pixels({})", self.max_pixels));
        }
        let a = self.augment;
        if a.flip {
            parts.push("flip".into());
        }
        if let Some(delta) = a.brightness {
            parts.push(format!("brightness({delta})"));
        }
        if let Some((lo, hi)) = a.contrast {
            parts.push(format!("contrast({lo},{hi})"));
        }
        if let Some((lo, hi)) = a.saturation {
            parts.push(format!("saturation({lo},{hi})"));
        }
        match (self.dct_scale, matches!(self.crop, Crop::Random(_))) {
            (true, false) => parts.push("dct_scale".into()),
            (false, true) => parts.push("exact".into()),
            _ => {}
        }
        parts.join(",")
    }
}

/// The group of `dct_scale` and `exact`.
const JPEG_SCALING: &str = "JPEG scaling";

/// The comma-separated options of `options`, commas inside parentheses
/// kept (`contrast(0.8,1.2)` is one option).
fn split_options(options: &str) -> impl Iterator<Item = &str> {
    let mut depth = 0usize;
    options
        .split(move |c| {
            match c {
                '(' => depth += 1,
                ')' => depth = depth.saturating_sub(1),
                _ => {}
            }
            c == ',' && depth == 0
        })
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// The numbers of an option's argument, `count` of them.
fn numbers(word: &str, arg: Option<&str>, count: usize, example: &str) -> Result<Vec<f32>, String> {
    let bad = || format!("image option {word} needs {example}, not {arg:?}");
    let values: Vec<f32> = arg
        .ok_or_else(bad)?
        .split(',')
        .map(|v| v.trim().parse::<f32>())
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    if values.len() != count {
        return Err(bad());
    }
    Ok(values)
}

/// `word` or `word(arg)`.
fn split_call(option: &str) -> Result<(&str, Option<&str>), String> {
    match option.split_once('(') {
        None => Ok((option, None)),
        Some((word, rest)) => match rest.strip_suffix(')') {
            Some(arg) => Ok((word, Some(arg.trim()))),
            None => Err(format!("image option {option:?}: missing `)`")),
        },
    }
}

/// Applies one option; returns the group it sets (each group at most once).
fn apply(o: &mut ImageOptions, word: &str, arg: Option<&str>) -> Result<&'static str, String> {
    let no_arg = |group: &'static str| match arg {
        None => Ok(group),
        Some(_) => Err(format!("image option {word:?} takes no argument")),
    };
    match word {
        "bilinear" | "area" | "nearest" => {
            o.method = ResizeMethod::from_name(word).unwrap_or_default();
            no_arg("resize method")
        }
        "dct_scale" | "exact" => {
            o.dct_scale = word == "dct_scale";
            no_arg(JPEG_SCALING)
        }
        "antialias" => {
            o.antialias = true;
            no_arg("antialias")
        }
        "center" => {
            let fraction = match arg {
                None => DEFAULT_CENTER_FRACTION,
                Some(f) => f.parse().map_err(|_| {
                    format!("invalid centre crop fraction {f:?} (expected e.g. 0.875)")
                })?,
            };
            o.crop = Crop::Center { fraction };
            Ok("crop")
        }
        "normalize" => {
            let v = numbers(
                word,
                arg,
                6,
                "3 means and 3 standard deviations on the 0..1 scale, e.g. \
                 normalize(0.5,0.5,0.5,0.25,0.25,0.25)",
            )?;
            o.output = OutputType::Float32 {
                mean: [v[0], v[1], v[2]],
                std: [v[3], v[4], v[5]],
            };
            Ok("output type")
        }
        "uint8" | "float32" | "imagenet" => {
            o.output = match word {
                "uint8" => OutputType::Uint8,
                "float32" => OutputType::UNIT_FLOAT,
                _ => OutputType::IMAGENET,
            };
            no_arg("output type")
        }
        "nhwc" | "nchw" => {
            o.layout = if word == "nchw" {
                ImageLayout::Nchw
            } else {
                ImageLayout::Nhwc
            };
            no_arg("layout")
        }
        "max_pixels" => {
            let n = arg.and_then(|n| n.parse().ok()).ok_or_else(|| {
                format!(
                    "image option max_pixels needs a count, e.g. max_pixels(100000000), not {arg:?}"
                )
            })?;
            o.max_pixels = n;
            Ok("pixel limit")
        }
        "random_crop" => {
            let mut random = RandomCrop::default();
            if arg.is_some() {
                let v = numbers(word, arg, 2, "an area range, e.g. random_crop(0.08,1)")?;
                random.area = (v[0], v[1]);
            }
            o.crop = Crop::Random(random);
            Ok("crop")
        }
        "flip" => {
            o.augment.flip = true;
            no_arg("flip")
        }
        "brightness" => {
            let v = numbers(word, arg, 1, "a max delta, e.g. brightness(0.1)")?;
            o.augment.brightness = Some(v[0]);
            Ok("brightness")
        }
        "contrast" | "saturation" => {
            let v = numbers(word, arg, 2, "a factor range, e.g. contrast(0.8,1.2)")?;
            if word == "contrast" {
                o.augment.contrast = Some((v[0], v[1]));
            } else {
                o.augment.saturation = Some((v[0], v[1]));
            }
            Ok(if word == "contrast" {
                "contrast"
            } else {
                "saturation"
            })
        }
        _ => Err(format!(
            "unknown image option {word:?} (expected bilinear, area, nearest, antialias, center, \
             center(F), uint8, float32, imagenet, normalize(M,M,M,S,S,S), nhwc, nchw, \
             max_pixels(N), random_crop, \
             random_crop(A,B), flip, brightness(D), contrast(L,U) or saturation(L,U))"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_form_round_trips() {
        for options in [
            "",
            "center",
            "center(0.5),nearest,antialias,imagenet,nchw",
            "area,float32,max_pixels(1000)",
            "random_crop,flip",
            "normalize(0.5,0.25,0,1,2,0.5),nchw",
            "random_crop(0.25,0.75),imagenet,flip,brightness(0.1),contrast(0.8,1.2),saturation(0.5,1.5)",
            "center,dct_scale",
            "random_crop,flip,exact",
        ] {
            let o = ImageOptions::from_text("28x28x1", options).unwrap();
            assert_eq!(o.options_text(), options);
            assert_eq!(
                ImageOptions::from_text("28x28x1", &o.options_text()).unwrap(),
                o
            );
        }
    }

    #[test]
    fn dct_scaling_is_the_default_of_the_random_crop_only() {
        let scaled = |options| ImageOptions::from_text("8x8x3", options).unwrap().dct_scale;
        assert!(scaled("random_crop"));
        assert!(scaled("random_crop(0.5,1),flip"));
        assert!(!scaled("random_crop,exact"));
        assert!(!scaled(""));
        assert!(!scaled("center,area"));
        assert!(scaled("dct_scale"));
        assert!(!ImageOptions::new(8, 8, 3).dct_scale);
    }

    #[test]
    fn mistakes_are_explained() {
        let twice = ImageOptions::from_text("8x8x3", "exact,dct_scale").unwrap_err();
        assert!(twice.contains("JPEG scaling is given twice"), "{twice}");
        let err = |size, options| ImageOptions::from_text(size, options).unwrap_err();
        assert!(err("28x28", "").contains("expected HxWxC"));
        assert!(err("28x28x2", "").contains("channels must be 1 or 3"));
        assert!(err("28x28x1", "area,nearest").contains("resize method is given twice"));
        assert!(err("28x28x1", "bicubic").contains("unknown image option \"bicubic\""));
        assert!(err("28x28x1", "center(2)").contains("(0, 1]"));
        assert!(err("28x28x1", "max_pixels").contains("needs a count"));
        assert!(err("28x28x1", "center,random_crop").contains("crop is given twice"));
        assert!(err("28x28x1", "contrast(0.8)").contains("needs a factor range"));
        assert!(err("28x28x1", "brightness").contains("needs a max delta"));
        assert!(err("28x28x1", "random_crop(0,1)").contains("0 < min <= max <= 1"));
        assert!(err("28x28x1", "saturation(2,1)").contains("0 <= lower <= upper"));
    }
}
