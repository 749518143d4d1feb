//! Choosing a built-in model for the data: the one place the rules live.
//!
//! [`ModelConfig::for_input`] takes the parsed input ([`InputSpec`]) and
//! what the user asked for ([`ModelRequest`], every part optional) and
//! returns the model, or a [`ModelChoiceError`] saying which setting does
//! not fit the data and why. [`ModelConfig::check_input`] is the same
//! rules applied to a model that was given rather than chosen (a resumed
//! checkpoint's, or one built in code): a model that `for_input` returns
//! always passes it.
//!
//! The rules: a variable-length int64 feature is token ids and takes the
//! embedding model (no other model reads tokens); an image decoded from
//! encoded bytes (an `image` feature spec) takes the CNN at the image's
//! size; otherwise the inputs are fixed-shape numbers and take the MLP. The
//! CNN can be asked for by name on any one image-shaped input
//! ([`ImageInput::of_schema`]; 28x28x1 when the input has no shape of its
//! own). The CNN and the embedding model are classifiers; a regression
//! takes the MLP.

use super::{ImageShape, InputSpec, LabelClasses, ModelConfig, Setting, Task, TrainError};
use crate::example::{DType, Layout, Schema};
use crate::image::ImageLayout;

/// The built-in model families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// A multilayer perceptron (classifier or regressor).
    Mlp,
    /// The LeNet-like CNN over images (28x28x1 by default).
    Cnn,
    /// The bag-of-tokens classifier over token ids.
    Embedding,
}

impl ModelKind {
    /// The lower-case name (`mlp`, `cnn`, `embedding`).
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Mlp => "mlp",
            ModelKind::Cnn => "cnn",
            ModelKind::Embedding => "embedding",
        }
    }
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ModelKind {
    type Err = ModelChoiceError;

    /// `mlp`, `cnn` or `embedding`, in any case.
    fn from_str(text: &str) -> Result<ModelKind, ModelChoiceError> {
        match text.to_ascii_lowercase().as_str() {
            "mlp" => Ok(ModelKind::Mlp),
            "cnn" => Ok(ModelKind::Cnn),
            "embedding" => Ok(ModelKind::Embedding),
            _ => Err(ModelChoiceError::UnknownKind {
                name: text.to_string(),
            }),
        }
    }
}

/// What the user asked of the model; whatever is `None` the data decides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelRequest {
    /// The family; by default the embedding model for token ids, else the MLP.
    pub kind: Option<ModelKind>,
    /// Hidden layer sizes (MLP: 256; embedding model's head: 64).
    pub hidden: Option<Vec<usize>>,
    /// The token vocabulary size (ids in `0..vocab`): the embedding
    /// table's rows. Required for the embedding model unless the schema
    /// records it (`fallback_vocab` of [`ModelConfig::for_input`]).
    pub vocab_size: Option<usize>,
    /// The embedding width (32).
    pub embedding_dim: Option<usize>,
    /// The inputs seen as one image: the CNN's input size (by default
    /// 28x28x1), and, for a decoded image, the data's choice of the CNN.
    pub image: Option<ImageInput>,
}

/// The model's inputs seen as one image: what sizes the CNN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInput {
    /// The feature.
    pub feature: String,
    /// Its `[H, W, C]`.
    pub shape: ImageShape,
    /// Whether it is decoded from encoded bytes (an `image` spec), which
    /// makes the CNN the data's choice; a plain `[H, W, C]` number feature
    /// only sizes the CNN when it is asked for.
    pub decoded: bool,
}

impl ImageInput {
    /// The one input feature of `input` as an image, from its spec in
    /// `schema`: an `image` feature (NHWC) at its decoded size, or a fixed
    /// feature of shape `[H, W, C]` or `[H, W]` (one channel). `None` when
    /// the inputs are not one such feature (several features, imputed
    /// inputs, token ids, another shape).
    ///
    /// ```
    /// use tfpipe::Schema;
    /// use tfpipe::train::{ImageInput, ImageShape, InputSpec, Task};
    ///
    /// let mut schema = Schema::from_feature_texts(&["image:image:32x32x3:center", "label:int64"])?;
    /// schema.label = Some("label".into());
    /// let input = InputSpec::from_schema(&schema, Task::Classification { classes: 10 })?.spec;
    /// let image = ImageInput::of_schema(&schema, &input)?.unwrap();
    /// assert_eq!((image.shape, image.decoded), (ImageShape::new(32, 32, 3), true));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn of_schema(
        schema: &Schema,
        input: &InputSpec,
    ) -> Result<Option<ImageInput>, ModelChoiceError> {
        let ([(name, _)], None, None) = (&input.features[..], &input.tokens, &input.impute) else {
            return Ok(None);
        };
        let Some(spec) = schema.feature(name) else {
            return Ok(None);
        };
        if let Some(image) = &spec.image {
            if image.layout == ImageLayout::Nchw {
                return Err(ModelChoiceError::ChannelsFirst {
                    feature: name.clone(),
                });
            }
            return Ok(Some(ImageInput {
                feature: name.clone(),
                shape: ImageShape::new(image.height, image.width, image.channels),
                decoded: true,
            }));
        }
        let shape = match &spec.layout {
            Layout::Fixed(shape) => match shape[..] {
                [h, w] => ImageShape::new(h, w, 1),
                [h, w, c] => ImageShape::new(h, w, c),
                _ => return Ok(None),
            },
            _ => return Ok(None),
        };
        Ok(Some(ImageInput {
            feature: name.clone(),
            shape,
            decoded: false,
        }))
    }
}

/// A model chosen for the data, and, when the data chose its family, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelChoice {
    /// The model.
    pub config: ModelConfig,
    /// Set when [`ModelRequest::kind`] was `None`: what in the data chose
    /// the family (print it: a model is never switched silently).
    pub chosen_because: Option<String>,
}

/// A model setting that does not fit the data or the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelChoiceError {
    /// Not a built-in model's name.
    #[error("unknown model {name:?} (expected mlp, cnn or embedding)")]
    UnknownKind {
        /// The name given.
        name: String,
    },
    /// Token ids given to a model that does not read them.
    #[error(
        "the {model} model does not take token ids ({feature:?} is variable-length int64); the embedding model does"
    )]
    TokensNeedEmbedding {
        /// The model asked for.
        model: ModelKind,
        /// The token feature.
        feature: String,
    },
    /// The embedding model without a token feature.
    #[error("the embedding model needs a variable-length int64 feature (token ids)")]
    NoTokens,
    /// A classifier-only model asked to regress.
    #[error("the {model} model is a classifier; a regression takes the mlp model")]
    ClassifierOnly {
        /// The model asked for.
        model: ModelKind,
    },
    /// The embedding model with no known vocabulary size.
    #[error(
        "the embedding model needs the vocabulary size of {feature:?} (ids are in 0..N), and the schema records none"
    )]
    UnknownVocabulary {
        /// The token feature.
        feature: String,
    },
    /// The CNN given channels-first images.
    #[error("the cnn model reads images as [H, W, C]; {feature:?} is decoded as [C, H, W] (nchw)")]
    ChannelsFirst {
        /// The image feature.
        feature: String,
    },
    /// Hidden sizes given to a model that has none to set.
    #[error("hidden layer sizes apply to the mlp and embedding models, not to the {model} model")]
    HiddenNotApplicable {
        /// The model asked for.
        model: ModelKind,
    },
    /// The model takes another number of inputs than the features give.
    #[error("{model} takes {expected} input values per example; the features give {found}")]
    InputCount {
        /// The model's description.
        model: String,
        /// What the model takes.
        expected: usize,
        /// What the features give.
        found: usize,
    },
    /// The model learns another task than the input's label asks for.
    #[error("{model} learns {model_task:?}, but the input's label is for {input_task:?}")]
    TaskMismatch {
        /// The model's description.
        model: String,
        /// What the model learns.
        model_task: Task,
        /// What the input spec's label asks for.
        input_task: Task,
    },
    /// The token input's vocabulary and the embedding table disagree.
    #[error(
        "the token input's vocabulary is {input} ids, but the embedding table has {table} rows"
    )]
    VocabularyMismatch {
        /// The input spec's vocabulary.
        input: usize,
        /// The embedding's rows.
        table: usize,
    },
}

impl ModelConfig {
    /// The built-in model for `input`, as `request` asks, the data deciding
    /// what it leaves open. The rules: a variable-length int64 feature is
    /// token ids and takes the embedding model (no other model reads
    /// tokens); a decoded image ([`ModelRequest::image`]) takes the CNN at
    /// its size when the task is classification; otherwise the inputs are
    /// fixed-shape numbers and take the MLP. The CNN asked for by name takes
    /// the request's image size, by default 28x28x1. The CNN and the
    /// embedding model are classifiers; a regression takes the MLP.
    /// `fallback_vocab` is the token vocabulary size the schema records,
    /// used when the request gives none.
    ///
    /// ```
    /// use tfpipe::train::{InputSpec, ModelConfig, ModelKind, ModelRequest, Task};
    ///
    /// let input = InputSpec {
    ///     features: vec![("pixels".into(), 784)],
    ///     label: Some("label".into()),
    ///     task: Task::Classification { classes: 10 },
    ///     standardize: vec![],
    ///     tokens: None,
    ///     impute: None,
    /// };
    /// let chosen = ModelConfig::for_input(&input, &ModelRequest::default(), None)?;
    /// assert_eq!(chosen.config.describe(), "mlp 784-256-10");
    /// assert!(chosen.chosen_because.is_some());
    ///
    /// let cnn = ModelRequest { kind: Some(ModelKind::Cnn), ..ModelRequest::default() };
    /// assert_eq!(ModelConfig::for_input(&input, &cnn, None)?.config.describe(), "cnn lenet 1x28x28-10");
    /// # Ok::<(), tfpipe::train::ModelChoiceError>(())
    /// ```
    pub fn for_input(
        input: &InputSpec,
        request: &ModelRequest,
        fallback_vocab: Option<usize>,
    ) -> Result<ModelChoice, ModelChoiceError> {
        let decoded_image = request.image.as_ref().filter(|i| i.decoded);
        let data_kind = match (&input.tokens, decoded_image, input.task) {
            (Some(_), _, _) => ModelKind::Embedding,
            (None, Some(_), Task::Classification { .. }) => ModelKind::Cnn,
            (None, _, _) => ModelKind::Mlp,
        };
        let kind = request.kind.unwrap_or(data_kind);
        let config = match kind {
            ModelKind::Mlp => ModelConfig::mlp(
                input.inputs(),
                request.hidden.clone().unwrap_or_else(|| vec![256]),
                input.task,
            ),
            ModelKind::Cnn => {
                if request.hidden.is_some() {
                    return Err(ModelChoiceError::HiddenNotApplicable { model: kind });
                }
                let image = request.image.as_ref().map(|i| i.shape);
                ModelConfig::cnn(classifier_classes(input, kind)?, image.unwrap_or_default())
            }
            ModelKind::Embedding => {
                let tokens = input.tokens.as_ref().ok_or(ModelChoiceError::NoTokens)?;
                let classes = classifier_classes(input, kind)?;
                let vocab = request.vocab_size.or(fallback_vocab).ok_or_else(|| {
                    ModelChoiceError::UnknownVocabulary {
                        feature: tokens.name.clone(),
                    }
                })?;
                ModelConfig::Embedding {
                    vocab,
                    dim: request.embedding_dim.unwrap_or(32),
                    inputs: input.inputs(),
                    hidden: request.hidden.clone().unwrap_or_else(|| vec![64]),
                    classes,
                }
            }
        };
        config.check_input(input)?;
        let chosen_because = request.kind.is_none().then(|| match (&input.tokens, kind) {
            (Some(tokens), _) => format!(
                "{:?} is a variable-length int64 feature, taken as token ids",
                tokens.name
            ),
            (None, ModelKind::Cnn) => format!(
                "{:?} is an image decoded at {}",
                decoded_image.map_or("", |i| i.feature.as_str()),
                config.image().unwrap_or_default()
            ),
            (None, _) => "the inputs are fixed-shape numbers".to_string(),
        });
        Ok(ModelChoice {
            config,
            chosen_because,
        })
    }

    /// The family this model belongs to.
    pub fn kind(&self) -> ModelKind {
        match self {
            ModelConfig::Mlp { .. } | ModelConfig::Regressor { .. } => ModelKind::Mlp,
            ModelConfig::Cnn { .. } => ModelKind::Cnn,
            ModelConfig::Embedding { .. } => ModelKind::Embedding,
        }
    }

    /// Whether this model can train on `input`: it reads token ids exactly
    /// when the input has them, takes as many values as the features give,
    /// learns the input's task, and (the embedding model) has a table as
    /// large as the input's vocabulary.
    pub fn check_input(&self, input: &InputSpec) -> Result<(), ModelChoiceError> {
        match (self, &input.tokens) {
            (ModelConfig::Embedding { vocab, .. }, Some(tokens)) => {
                if let Some(v) = tokens.vocab
                    && v != *vocab
                {
                    return Err(ModelChoiceError::VocabularyMismatch {
                        input: v,
                        table: *vocab,
                    });
                }
            }
            (ModelConfig::Embedding { .. }, None) => return Err(ModelChoiceError::NoTokens),
            (other, Some(tokens)) => {
                return Err(ModelChoiceError::TokensNeedEmbedding {
                    model: other.kind(),
                    feature: tokens.name.clone(),
                });
            }
            (_, None) => {}
        }
        if self.inputs() != input.inputs() {
            return Err(ModelChoiceError::InputCount {
                model: self.describe(),
                expected: self.inputs(),
                found: input.inputs(),
            });
        }
        if self.task() != input.task {
            return Err(ModelChoiceError::TaskMismatch {
                model: self.describe(),
                model_task: self.task(),
                input_task: input.task,
            });
        }
        Ok(())
    }
}

/// The number of classes, for a model that only classifies.
fn classifier_classes(input: &InputSpec, model: ModelKind) -> Result<usize, ModelChoiceError> {
    match input.task {
        Task::Classification { classes } => Ok(classes),
        Task::Regression => Err(ModelChoiceError::ClassifierOnly { model }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::TokenSpec;

    fn numbers(inputs: usize, task: Task) -> InputSpec {
        InputSpec {
            features: vec![("x".into(), inputs)],
            label: Some("y".into()),
            task,
            standardize: vec![],
            tokens: None,
            impute: None,
        }
    }

    fn tokens(vocab: Option<usize>) -> InputSpec {
        InputSpec {
            features: vec![],
            tokens: Some(TokenSpec {
                name: "ids".into(),
                vocab,
            }),
            ..numbers(0, Task::Classification { classes: 3 })
        }
    }

    fn ask(kind: Option<ModelKind>) -> ModelRequest {
        ModelRequest {
            kind,
            ..ModelRequest::default()
        }
    }

    #[test]
    fn the_data_chooses_the_family_and_says_why() {
        let classes = Task::Classification { classes: 10 };
        let mlp = ModelConfig::for_input(&numbers(784, classes), &ask(None), None).unwrap();
        assert_eq!(
            mlp.config,
            ModelConfig::Mlp {
                inputs: 784,
                hidden: vec![256],
                classes: 10
            }
        );
        assert!(mlp.chosen_because.unwrap().contains("fixed-shape"));
        let regressor =
            ModelConfig::for_input(&numbers(3, Task::Regression), &ask(None), None).unwrap();
        assert_eq!(regressor.config.kind(), ModelKind::Mlp);
        assert_eq!(regressor.config.task(), Task::Regression);
        let embedding = ModelConfig::for_input(&tokens(None), &ask(None), Some(50)).unwrap();
        assert!(matches!(
            embedding.config,
            ModelConfig::Embedding {
                vocab: 50,
                dim: 32,
                ..
            }
        ));
        assert!(embedding.chosen_because.unwrap().contains("\"ids\""));
        let asked =
            ModelConfig::for_input(&numbers(784, classes), &ask(Some(ModelKind::Cnn)), None);
        assert_eq!(asked.unwrap().chosen_because, None);
    }

    fn labelled(features: &[&str]) -> (Schema, InputSpec) {
        let mut texts = features.to_vec();
        texts.push("label:int64");
        let mut schema = Schema::from_feature_texts(&texts).unwrap();
        schema.label = Some("label".into());
        let classes = Task::Classification { classes: 10 };
        let spec = InputSpec::from_schema(&schema, classes).unwrap().spec;
        (schema, spec)
    }

    /// A decoded image takes the CNN at its size, said aloud; a plain
    /// `[H, W, C]` feature sizes the CNN only when asked for; other inputs
    /// are no image.
    #[test]
    fn an_image_input_sizes_the_cnn_and_a_decoded_one_chooses_it() {
        let (schema, input) = labelled(&["image/encoded:image:32x24x3:center"]);
        let image = ImageInput::of_schema(&schema, &input).unwrap().unwrap();
        assert_eq!(image.shape, ImageShape::new(32, 24, 3));
        assert!(image.decoded);
        let request = ModelRequest {
            image: Some(image),
            ..ask(None)
        };
        let chosen = ModelConfig::for_input(&input, &request, None).unwrap();
        assert_eq!(
            chosen.config,
            ModelConfig::cnn(10, ImageShape::new(32, 24, 3))
        );
        let why = chosen.chosen_because.unwrap();
        assert!(
            why.contains("\"image/encoded\" is an image decoded at 32x24x3"),
            "{why}"
        );
        // The MLP when asked for, over the same values.
        let mlp = ModelConfig::for_input(
            &input,
            &ModelRequest {
                kind: Some(ModelKind::Mlp),
                ..request
            },
            None,
        );
        assert_eq!(mlp.unwrap().config.inputs(), 32 * 24 * 3);

        let (schema, input) = labelled(&["pixels:uint8:20x20"]);
        let image = ImageInput::of_schema(&schema, &input).unwrap().unwrap();
        assert_eq!(
            (image.shape, image.decoded),
            (ImageShape::new(20, 20, 1), false)
        );
        let request = ModelRequest {
            image: Some(image),
            ..ask(None)
        };
        let chosen = ModelConfig::for_input(&input, &request, None).unwrap();
        assert_eq!(chosen.config.kind(), ModelKind::Mlp);
        let asked = ModelRequest {
            kind: Some(ModelKind::Cnn),
            ..request
        };
        let chosen = ModelConfig::for_input(&input, &asked, None).unwrap();
        assert_eq!(
            chosen.config,
            ModelConfig::cnn(10, ImageShape::new(20, 20, 1))
        );

        for features in [&["pixels:uint8:784"][..], &["a:uint8:4x4", "b:uint8:4x4"]] {
            let (schema, input) = labelled(features);
            assert_eq!(ImageInput::of_schema(&schema, &input).unwrap(), None);
        }
        let (schema, input) = labelled(&["image:image:32x32x3:nchw"]);
        assert_eq!(
            ImageInput::of_schema(&schema, &input),
            Err(ModelChoiceError::ChannelsFirst {
                feature: "image".into()
            })
        );
    }

    #[test]
    fn the_request_overrides_sizes_and_the_recorded_vocabulary() {
        let request = ModelRequest {
            kind: Some(ModelKind::Embedding),
            hidden: Some(vec![8, 4]),
            vocab_size: Some(7),
            embedding_dim: Some(2),
            image: None,
        };
        let chosen = ModelConfig::for_input(&tokens(None), &request, Some(50)).unwrap();
        assert_eq!(
            chosen.config,
            ModelConfig::Embedding {
                vocab: 7,
                dim: 2,
                inputs: 0,
                hidden: vec![8, 4],
                classes: 3
            }
        );
    }

    #[test]
    fn each_misfit_is_its_own_error() {
        let classes = Task::Classification { classes: 10 };
        let cases: Vec<(InputSpec, ModelRequest, ModelChoiceError)> = vec![
            (
                tokens(None),
                ask(Some(ModelKind::Mlp)),
                ModelChoiceError::TokensNeedEmbedding {
                    model: ModelKind::Mlp,
                    feature: "ids".into(),
                },
            ),
            (
                numbers(4, classes),
                ask(Some(ModelKind::Embedding)),
                ModelChoiceError::NoTokens,
            ),
            (
                numbers(784, Task::Regression),
                ask(Some(ModelKind::Cnn)),
                ModelChoiceError::ClassifierOnly {
                    model: ModelKind::Cnn,
                },
            ),
            (
                tokens(None),
                ask(None),
                ModelChoiceError::UnknownVocabulary {
                    feature: "ids".into(),
                },
            ),
            (
                numbers(784, classes),
                ModelRequest {
                    hidden: Some(vec![3]),
                    ..ask(Some(ModelKind::Cnn))
                },
                ModelChoiceError::HiddenNotApplicable {
                    model: ModelKind::Cnn,
                },
            ),
            (
                numbers(100, classes),
                ask(Some(ModelKind::Cnn)),
                ModelChoiceError::InputCount {
                    model: "cnn lenet 1x28x28-10".into(),
                    expected: 784,
                    found: 100,
                },
            ),
        ];
        for (input, request, expected) in cases {
            let got = ModelConfig::for_input(&input, &request, None).unwrap_err();
            assert_eq!(got, expected, "{request:?}");
        }
    }

    #[test]
    fn a_given_model_is_checked_by_the_same_rules() {
        let input = tokens(Some(9));
        let table = ModelConfig::Embedding {
            vocab: 8,
            dim: 2,
            inputs: 0,
            hidden: vec![4],
            classes: 3,
        };
        assert_eq!(
            table.check_input(&input),
            Err(ModelChoiceError::VocabularyMismatch { input: 9, table: 8 })
        );
        let mlp = ModelConfig::mlp(4, vec![2], Task::Classification { classes: 2 });
        assert!(matches!(
            mlp.check_input(&numbers(4, Task::Classification { classes: 3 })),
            Err(ModelChoiceError::TaskMismatch { .. })
        ));
        assert!(
            mlp.check_input(&numbers(4, Task::Classification { classes: 2 }))
                .is_ok()
        );
    }

    #[test]
    fn model_names_parse_in_any_case() {
        assert_eq!("CNN".parse::<ModelKind>(), Ok(ModelKind::Cnn));
        assert_eq!(
            "resnet".parse::<ModelKind>(),
            Err(ModelChoiceError::UnknownKind {
                name: "resnet".into()
            })
        );
    }
}

/// Whether a label is learnt as classes or as a quantity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskKind {
    /// Class ids (int64) or class names (bytes).
    Classification,
    /// A float32 quantity.
    Regression,
}

impl std::str::FromStr for TaskKind {
    type Err = crate::error::UnknownName;

    /// `classification` or `regression`.
    fn from_str(text: &str) -> Result<TaskKind, Self::Err> {
        match text {
            "classification" => Ok(TaskKind::Classification),
            "regression" => Ok(TaskKind::Regression),
            _ => Err(crate::error::UnknownName {
                what: "task",
                name: text.to_string(),
                expected: "classification or regression",
            }),
        }
    }
}

impl TaskKind {
    /// The kind a label of `dtype` asks for, unless `requested`: a float32
    /// label is a regression target, any other a class.
    pub fn for_label(dtype: DType, requested: Option<TaskKind>) -> TaskKind {
        match (requested, dtype) {
            (Some(kind), _) => kind,
            (None, DType::Float32) => TaskKind::Regression,
            (None, _) => TaskKind::Classification,
        }
    }
}

impl Task {
    /// A classification over `classes` when given, else over the text
    /// label's classes, else over the count the schema file `recorded`.
    /// With none of them the count is unknown, an error: count an int64
    /// label's values with [`IntLabels`](super::IntLabels) and give the
    /// count it infers. Refuses fewer classes than the text label has
    /// (class ids would fall outside the output).
    ///
    /// ```
    /// use tfpipe::train::{LabelClasses, Task};
    ///
    /// let species = LabelClasses::new("species", vec!["Adelie".into(), "Gentoo".into()]);
    /// assert_eq!(Task::classification(None, Some(&species), None)?, Task::Classification { classes: 2 });
    /// assert_eq!(Task::classification(None, None, Some(3))?, Task::Classification { classes: 3 });
    /// assert!(Task::classification(Some(1), Some(&species), None).is_err());
    /// assert!(Task::classification(None, None, None).is_err()); // no default count
    /// # Ok::<(), tfpipe::train::TrainError>(())
    /// ```
    pub fn classification(
        classes: Option<usize>,
        text_label: Option<&LabelClasses>,
        recorded: Option<usize>,
    ) -> Result<Task, TrainError> {
        let counted = text_label.map(|c| c.names().len());
        let Some(classes) = classes.or(counted).or(recorded) else {
            return Err(TrainError::config(
                Setting::Classes,
                "not known: neither given, nor a text label's, nor recorded in the schema file",
            ));
        };
        if let (Some(count), Some(text)) = (counted, text_label)
            && classes < count
        {
            return Err(TrainError::config(
                Setting::Classes,
                format!(
                    "{classes}: the text label {:?} has {count} classes",
                    text.label()
                ),
            ));
        }
        Ok(Task::Classification { classes })
    }
}
