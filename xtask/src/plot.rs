//! `--plot FILE` of the benches: one horizontal grouped bar chart, a band per shape and a bar
//! per series (ours first, then the peers), written as SVG or PNG by the file's extension.
//!
//! Text is laid out with DejaVu Sans embedded in the binary (the `dejavu` crate, through
//! plotters' pure-Rust `ab_glyph`), so neither format needs a system font library.

use std::path::Path;
use std::sync::Once;

use plotters::coord::combinators::BindKeyPoints;
use plotters::coord::Shift;
use plotters::prelude::*;

/// One bar per shape; `None` leaves the bar out (a peer without that shape).
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub values: Vec<Option<f64>>,
}

/// A chart: `labels[i]` names shape i, every series has one value per label.
#[derive(Clone, Debug)]
pub struct Chart {
    pub title: String,
    /// The value axis (`time us`, `TFLOP/s`).
    pub unit: String,
    pub labels: Vec<String>,
    pub series: Vec<Series>,
}

const FONT: &str = "sans-serif";
const COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),  // ours
    RGBColor(255, 127, 14),  // first peer
    RGBColor(44, 160, 44),   // second peer
    RGBColor(148, 103, 189), // floor or ceiling
    RGBColor(127, 127, 127),
];

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The embedded font is a valid TTF; if registration ever failed, text would be
        // missing and drawing would report it, so the result needs no handling here.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
    });
}

/// Writes `chart` to `path` (`.svg` or `.png`).
pub fn write(path: &Path, chart: &Chart) -> Result<(), String> {
    if chart.labels.is_empty() {
        return Err("nothing to plot (no rows)".into());
    }
    if let Some(s) = chart.series.iter().find(|s| s.values.len() != chart.labels.len()) {
        return Err(format!(
            "series {} has {} values for {} shapes",
            s.name,
            s.values.len(),
            chart.labels.len()
        ));
    }
    register_font();
    let band = 12 * chart.series.len().max(1) as u32 + 10;
    let size = (1100, 110 + band * chart.labels.len() as u32);
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    let e = |e: String| format!("plotting {}: {e}", path.display());
    match ext.as_deref() {
        Some("svg") => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            draw(&root, chart).map_err(e)?;
            root.present().map_err(|er| e(er.to_string()))
        }
        Some("png") => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            draw(&root, chart).map_err(e)?;
            root.present().map_err(|er| e(er.to_string()))
        }
        _ => Err(format!("--plot {}: the file must end in .svg or .png", path.display())),
    }
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, chart: &Chart) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let s = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(s)?;
    let n = chart.labels.len();
    let max = chart.series.iter().flat_map(|s| s.values.iter().flatten()).fold(0.0f64, |m, &v| m.max(v));
    let x_max = if max > 0.0 && max.is_finite() { max * 1.18 } else { 1.0 };
    let label_chars = chart.labels.iter().map(|l| l.chars().count()).max().unwrap_or(8) as u32;
    // Shape i sits in the band [U (n-1-i), U (n-i)) of an integer axis (plotters formats
    // integer axes with a custom label function; its f64 axis with key points cannot be),
    // the first shape at the top, its label at the band's centre.
    const U: i32 = 1000;
    let centers: Vec<i32> = (0..n as i32).map(|i| i * U + U / 2).collect();
    let mut c = ChartBuilder::on(root)
        .caption(&chart.title, (FONT, 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(12 + 7 * label_chars)
        .build_cartesian_2d(0f64..x_max, (0..n as i32 * U).with_key_points(centers))
        .map_err(s)?;
    let labels = chart.labels.clone();
    c.configure_mesh()
        .disable_y_mesh()
        .y_label_formatter(&|y: &i32| {
            let i = n as i64 - 1 - (*y / U) as i64;
            usize::try_from(i).ok().and_then(|i| labels.get(i)).cloned().unwrap_or_default()
        })
        .x_desc(&chart.unit)
        .label_style((FONT, 13))
        .draw()
        .map_err(s)?;
    let k = chart.series.len().max(1) as i32;
    let bar = U * 8 / 10 / k;
    for (si, series) in chart.series.iter().enumerate() {
        let color = COLORS[si % COLORS.len()];
        let bars: Vec<(f64, i32, i32)> = series
            .values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.filter(|v| v.is_finite()).map(|v| (i, v)))
            .map(|(i, v)| {
                let top = (n - 1 - i) as i32 * U + U * 9 / 10 - bar * si as i32;
                (v, top - bar, top)
            })
            .collect();
        c.draw_series(bars.iter().map(|&(v, y0, y1)| Rectangle::new([(0.0, y0), (v, y1)], color.filled())))
            .map_err(s)?
            .label(series.name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        c.draw_series(bars.iter().map(|&(v, y0, y1)| {
            Text::new(format_value(v), (v + x_max * 0.005, (y0 + y1) / 2 + bar / 3), (FONT, 10).into_font())
        }))
        .map_err(s)?;
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font((FONT, 13))
        .draw()
        .map_err(s)?;
    Ok(())
}

/// Three significant figures, at most one decimal place (`0.69`, `20.1`, `757`).
pub fn format_value(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart() -> Chart {
        Chart {
            title: "test".into(),
            unit: "time us".into(),
            labels: vec!["h16 b128 s4096".into(), "h128 b1 s8192".into(), "h64 b32 s4096".into()],
            series: vec![
                Series { name: "vt".into(), values: vec![Some(201.1), Some(34.4), Some(97.9)] },
                Series { name: "FlashMLA".into(), values: vec![Some(174.6), None, Some(60.9)] },
            ],
        }
    }

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("vt-xtask-plot-{}-{name}", std::process::id()))
    }

    #[test]
    fn writes_svg_with_labels_and_legend() {
        let p = tmp("a.svg");
        write(&p, &chart()).expect("svg");
        let text = std::fs::read_to_string(&p).expect("read back");
        let _ = std::fs::remove_file(&p);
        assert!(text.starts_with("<svg"), "{}", &text[..text.len().min(80)]);
        for s in ["h128 b1 s8192", "FlashMLA", "201", "time us"] {
            assert!(text.contains(s), "missing {s}");
        }
    }

    #[test]
    fn writes_png() {
        let p = tmp("a.png");
        write(&p, &chart()).expect("png");
        let bytes = std::fs::read(&p).expect("read back");
        let _ = std::fs::remove_file(&p);
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(bytes.len() > 2000);
    }

    #[test]
    fn rejects_other_extensions_and_ragged_series() {
        assert!(write(&tmp("a.jpg"), &chart()).is_err());
        let mut c = chart();
        c.series[1].values.pop();
        assert!(write(&tmp("b.svg"), &c).is_err());
    }

    #[test]
    fn values_are_short() {
        assert_eq!(format_value(757.23), "757");
        assert_eq!(format_value(20.14), "20.1");
        assert_eq!(format_value(0.693), "0.69");
    }
}
