//! A PNG of a copy's rate over time, so a run can be judged at a glance:
//! stalls, ramp-up and the tail show in the shape of the line, which one
//! average number hides. The dashed mean line is the number a report quotes,
//! drawn over the samples it came from.
//!
//! Text (title, axis labels, tick labels, legend) needs a font. plotters'
//! `ttf` feature finds system fonts through font-kit, which needs the
//! fontconfig headers at build time; this module uses the `ab_glyph` feature
//! instead and registers a TrueType file read at run time from a few
//! standard paths ([`FONT_PATHS`]). On a machine with none of them the plot
//! is still written, without any text: a plot is a by-product of a copy, and
//! a missing font must never fail the copy.

use std::path::Path;
use std::sync::OnceLock;

use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

/// Width of the image, in pixels.
pub const WIDTH_PX: u32 = 1000;
/// Height of the image, in pixels.
pub const HEIGHT_PX: u32 = 500;

/// TrueType fonts tried in order, the first that parses is used: DejaVu Sans
/// on Debian/Ubuntu, Fedora and Arch, then Liberation Sans, FreeSans and
/// Noto Sans, then macOS's Arial.
pub const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/noto/NotoSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "/Library/Fonts/Arial.ttf",
];

/// Title text height, in pixels.
const TITLE_FONT_PX: u32 = 24;
/// Axis description, tick label and legend text height, in pixels.
const LABEL_FONT_PX: u32 = 16;
/// Blank border around the chart, in pixels.
const MARGIN_PX: u32 = 15;
/// Room below the plotting area for x tick labels and "time (s)", in pixels.
const X_LABEL_AREA_PX: u32 = 50;
/// Room left of the plotting area for y tick labels and "MB/s", in pixels.
const Y_LABEL_AREA_PX: u32 = 80;
/// Number of tick labels wanted on each axis (plotters rounds to nice steps).
const TICK_LABELS: usize = 10;
/// Width of the rate line, in pixels.
const RATE_LINE_PX: u32 = 2;
/// Radius of the marker drawn for a single sample (a one-point line draws
/// nothing), in pixels.
const SINGLE_SAMPLE_MARKER_PX: i32 = 4;
/// Length of one dash of the mean line, in pixels.
const DASH_PX: u32 = 8;
/// Gap between two dashes of the mean line, in pixels.
const DASH_GAP_PX: u32 = 6;
/// Length of the line sample drawn in a legend entry, in pixels.
const LEGEND_SAMPLE_PX: i32 = 24;
/// Headroom above the highest rate, as a fraction of the y span, so the
/// legend in the upper right corner (about 60 of the plot's 390 pixels)
/// sits above a steady copy's line rather than over it.
const Y_HEADROOM: f64 = 0.25;
/// Smallest x range, in seconds: a single sample at t = 0 still gets an axis.
const MIN_X_SPAN_S: f64 = 1.0;
/// Smallest y range, in MB/s: all-zero rates still get an axis.
const MIN_Y_SPAN_MB_S: f64 = 1.0;

/// The font family name the run-time font is registered under, the one
/// plotters' `FontFamily::SansSerif` resolves to.
const FONT_FAMILY: &str = "sans-serif";

/// Writes a [`WIDTH_PX`] x [`HEIGHT_PX`] PNG to `path`: copy rate over time,
/// x = seconds since the copy started, y = MB/s (decimal, 1e6 bytes), a line
/// through `samples` (`(seconds, mb_per_s)`, in the order given), `title` at
/// the top, axis labels "time (s)" and "MB/s", and a dashed horizontal line
/// at the mean rate with a legend entry "mean 312.4 MB/s".
///
/// The mean is the unweighted mean of the sampled rates, which is the
/// time-average when the samples are evenly spaced, as a rate sampler's are.
///
/// Without any of the [`FONT_PATHS`] the plot is written with no text at all
/// (no title, labels, tick labels or legend; the line, mean line and grid
/// are still drawn) and the function returns `Ok`: a missing font must
/// never fail the copy it plots.
///
/// Degenerate input: an empty `samples` is an `Err` (there is no rate to
/// plot, and an empty chart would pass for a copy that ran at zero); so is
/// a non-finite time or rate, which is a bug in the sampler. A single
/// sample is drawn as a marker; all-zero rates get a y axis from 0 to
/// [`MIN_Y_SPAN_MB_S`]. Errors creating or encoding the file are `Err` with
/// the path in the message.
pub fn write_rate_png(path: &Path, title: &str, samples: &[(f64, f64)]) -> Result<(), String> {
    render(path, title, samples, font_registered())
}

/// Registers the first parsable font of [`FONT_PATHS`] with plotters, once
/// per process; returns whether one is registered. The bytes are leaked
/// because plotters keeps a `'static` reference to them; that is one font
/// file per process (and one more per file that exists but does not parse).
fn font_registered() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        FONT_PATHS
            .iter()
            .any(|candidate| match std::fs::read(candidate) {
                Ok(bytes) => {
                    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                    register_font(FONT_FAMILY, FontStyle::Normal, bytes).is_ok()
                }
                Err(_) => false,
            })
    })
}

/// The axis ranges: x from min(0, first time) to the last time, y from
/// min(0, lowest rate) to the highest rate plus [`Y_HEADROOM`], each at
/// least its `MIN_*_SPAN` wide.
fn ranges(samples: &[(f64, f64)]) -> (std::ops::Range<f64>, std::ops::Range<f64>) {
    let (mut x_lo, mut x_hi, mut y_lo, mut y_hi) = (0.0_f64, 0.0_f64, 0.0_f64, 0.0_f64);
    for &(x, y) in samples {
        x_lo = x_lo.min(x);
        x_hi = x_hi.max(x);
        y_lo = y_lo.min(y);
        y_hi = y_hi.max(y);
    }
    let x_hi = x_hi.max(x_lo + MIN_X_SPAN_S);
    let y_hi = (y_hi + (y_hi - y_lo) * Y_HEADROOM).max(y_lo + MIN_Y_SPAN_MB_S);
    (x_lo..x_hi, y_lo..y_hi)
}

/// Draws the plot; `with_text` false leaves out everything that needs a font
/// (plotters' ab_glyph backend fails any text without a registered font).
fn render(path: &Path, title: &str, samples: &[(f64, f64)], with_text: bool) -> Result<(), String> {
    if samples.is_empty() {
        return Err(format!("rate plot {}: no samples to plot", path.display()));
    }
    if let Some(i) = samples
        .iter()
        .position(|&(x, y)| !x.is_finite() || !y.is_finite())
    {
        return Err(format!(
            "rate plot {}: sample {i} is not finite: {:?}",
            path.display(),
            samples[i]
        ));
    }
    let err = |what: &str, e: &dyn std::fmt::Display| {
        format!("rate plot {}: {what}: {e}", path.display())
    };

    let mean = samples.iter().map(|&(_, y)| y).sum::<f64>() / samples.len() as f64;
    let (x_range, y_range) = ranges(samples);
    let (x_lo, x_hi) = (x_range.start, x_range.end);

    let root = BitMapBackend::new(path, (WIDTH_PX, HEIGHT_PX)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err("fill", &e))?;

    let mut builder = ChartBuilder::on(&root);
    builder.margin(MARGIN_PX);
    if with_text {
        builder
            .caption(title, (FONT_FAMILY, TITLE_FONT_PX))
            .x_label_area_size(X_LABEL_AREA_PX)
            .y_label_area_size(Y_LABEL_AREA_PX);
    }
    let mut chart = builder
        .build_cartesian_2d(x_range, y_range)
        .map_err(|e| err("axes", &e))?;

    // With no label areas (no font) plotters draws the grid only: the tick
    // labels and axis descriptions live in the label areas.
    let mut mesh = chart.configure_mesh();
    mesh.x_labels(TICK_LABELS).y_labels(TICK_LABELS);
    if with_text {
        mesh.x_desc("time (s)")
            .y_desc("MB/s")
            .label_style((FONT_FAMILY, LABEL_FONT_PX));
    }
    mesh.draw().map_err(|e| err("grid", &e))?;

    let rate_style = BLUE.stroke_width(RATE_LINE_PX);
    chart
        .draw_series(LineSeries::new(samples.iter().copied(), rate_style))
        .map_err(|e| err("rate line", &e))?
        .label("rate")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + LEGEND_SAMPLE_PX, y)], rate_style));
    if let [only] = samples {
        chart
            .draw_series(std::iter::once(Circle::new(
                *only,
                SINGLE_SAMPLE_MARKER_PX,
                BLUE.filled(),
            )))
            .map_err(|e| err("sample marker", &e))?;
    }

    let mean_style = RED.stroke_width(RATE_LINE_PX);
    chart
        .draw_series(DashedLineSeries::new(
            [(x_lo, mean), (x_hi, mean)],
            DASH_PX,
            DASH_GAP_PX,
            mean_style,
        ))
        .map_err(|e| err("mean line", &e))?
        .label(format!("mean {mean:.1} MB/s"))
        .legend(move |(x, y)| {
            DashedPathElement::new(
                [(x, y), (x + LEGEND_SAMPLE_PX, y)],
                DASH_PX / 2,
                DASH_GAP_PX / 2,
                mean_style,
            )
        });

    if with_text {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font((FONT_FAMILY, LABEL_FONT_PX))
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err("legend", &e))?;
    }

    root.present().map_err(|e| err("write", &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];
    /// A 1000x500 plot with a grid and a line compresses to well over this.
    const MIN_PLOT_BYTES: u64 = 4 * 1024;

    /// A ramp-up, a plateau with noise, a stall and a tail, every 0.5 s.
    fn copy_like_samples() -> Vec<(f64, f64)> {
        (0..120)
            .map(|i| {
                let t = f64::from(i) * 0.5;
                let rate = match i {
                    0..=9 => 35.0 * f64::from(i),
                    50..=54 => 20.0,
                    110.. => 300.0 - 25.0 * f64::from(i - 110),
                    _ => 310.0 + 15.0 * (t * 1.7).sin(),
                };
                (t, rate)
            })
            .collect()
    }

    fn assert_png(path: &Path) -> u64 {
        let bytes = std::fs::read(path).expect("read png");
        assert!(
            bytes.starts_with(&PNG_SIGNATURE),
            "{} is not a PNG",
            path.display()
        );
        let len = bytes.len() as u64;
        assert!(
            len > MIN_PLOT_BYTES,
            "{} is only {len} bytes",
            path.display()
        );
        len
    }

    #[test]
    fn writes_a_png() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("rate.png");
        write_rate_png(&path, "copy shard 7: 2 GiB", &copy_like_samples()).expect("plot");
        assert_png(&path);
    }

    /// Text is drawn when a font is found: the same plot with text is a
    /// bigger PNG than without (glyphs are extra anti-aliased pixels).
    #[test]
    fn text_renders_when_a_font_is_found() {
        if !font_registered() {
            eprintln!("no font in FONT_PATHS on this machine; text rendering not checked");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let samples = copy_like_samples();
        let with = dir.path().join("with.png");
        let without = dir.path().join("without.png");
        render(&with, "copy shard 7: 2 GiB", &samples, true).expect("with text");
        render(&without, "copy shard 7: 2 GiB", &samples, false).expect("without text");
        let (with, without) = (assert_png(&with), assert_png(&without));
        assert!(
            with > without,
            "with text {with} bytes, without {without} bytes"
        );
    }

    #[test]
    fn degenerate_samples() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("rate.png");

        let empty = write_rate_png(&path, "empty", &[]).expect_err("empty samples");
        assert!(empty.contains("no samples"), "{empty}");
        assert!(!path.exists(), "no file for an empty plot");

        let nan = write_rate_png(&path, "nan", &[(0.0, 1.0), (1.0, f64::NAN)])
            .expect_err("non-finite sample");
        assert!(nan.contains("sample 1"), "{nan}");

        for (name, samples) in [
            ("single", vec![(0.0, 250.0)]),
            ("single-late", vec![(3.5, 250.0)]),
            ("zeros", vec![(0.0, 0.0), (1.0, 0.0), (2.0, 0.0)]),
            ("single-zero", vec![(0.0, 0.0)]),
        ] {
            let path = dir.path().join(format!("{name}.png"));
            write_rate_png(&path, name, &samples).expect(name);
            assert_png(&path);
            render(&path, name, &samples, false).expect(name);
            assert_png(&path);
        }
    }

    #[test]
    fn unwritable_path_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("missing-dir").join("rate.png");
        let e = write_rate_png(&path, "t", &[(0.0, 1.0), (1.0, 2.0)]).expect_err("bad path");
        assert!(e.contains("missing-dir"), "{e}");
    }
}
