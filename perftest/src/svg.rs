//! Hand-written SVG line charts: message size on a log2 x axis, the figure
//! on a linear (bandwidth) or log10 (latency) y axis, one line per stack,
//! axis labels and a legend.

use crate::probes::size_label;

#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    /// A second, smaller legend line (which side measures).
    pub detail: String,
    /// (message size in bytes, value); non-positive sizes and values that
    /// a log axis cannot show are dropped.
    pub points: Vec<(f64, f64)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_y: bool,
    pub series: Vec<Series>,
}

const W: f64 = 900.0;
const H: f64 = 500.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 250.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 70.0;
const COLORS: &[&str] = &[
    "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" tick step (1, 2 or 5 × 10^k) giving about `n` ticks over `span`.
pub fn nice_step(span: f64, n: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / n;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn fmt_tick(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1.0 && (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Renders `c` as a standalone SVG document.
pub fn render(c: &Chart) -> String {
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let usable =
        |&(x, y): &(f64, f64)| x > 0.0 && y.is_finite() && (y > 0.0 || (!c.log_y && y >= 0.0));
    let all: Vec<(f64, f64)> = c
        .series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(usable)
        .collect();
    // x: log2, whole powers of two around the data (2 B … 8 MiB by default)
    let (mut x0, mut x1) = all
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    if all.is_empty() {
        x0 = 2.0;
        x1 = 8.0 * 1048576.0;
    }
    let (lx0, mut lx1) = (x0.log2().floor(), x1.log2().ceil());
    if lx1 <= lx0 {
        lx1 = lx0 + 1.0;
    }
    let px = |x: f64| LEFT + (x.log2() - lx0) / (lx1 - lx0) * pw;
    // y
    let ymax_data = all.iter().map(|p| p.1).fold(0.0f64, f64::max);
    let ymin_data = all
        .iter()
        .map(|p| p.1)
        .filter(|v| *v > 0.0)
        .fold(f64::MAX, f64::min);
    let (ly0, ly1, lin_max, step) = if c.log_y {
        let lo = if ymin_data == f64::MAX {
            0.0
        } else {
            ymin_data.log10().floor()
        };
        let mut hi = if ymax_data > 0.0 {
            ymax_data.log10().ceil()
        } else {
            lo + 1.0
        };
        if hi <= lo {
            hi = lo + 1.0;
        }
        (lo, hi, 0.0, 0.0)
    } else {
        let step = nice_step(if ymax_data > 0.0 { ymax_data } else { 1.0 }, 5.0);
        let top = ((ymax_data / step).ceil() * step).max(step);
        (0.0, 0.0, top, step)
    };
    let py = |y: f64| {
        let f = if c.log_y {
            (y.log10() - ly0) / (ly1 - ly0)
        } else {
            y / lin_max
        };
        TOP + ph - f * ph
    };

    let mut s = String::new();
    s.push_str(&format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"12\">\n"
    ));
    s.push_str(&format!(
        "<rect x=\"0\" y=\"0\" width=\"{W}\" height=\"{H}\" fill=\"white\"/>\n"
    ));
    s.push_str(&format!(
        "<text x=\"{}\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">{}</text>\n",
        LEFT + pw / 2.0,
        esc(&c.title)
    ));
    // grid and ticks: x
    let mut e = lx0;
    while e <= lx1 + 1e-9 {
        let x = px(2f64.powf(e));
        s.push_str(&format!(
            "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#e0e0e0\"/>\n",
            TOP + ph
        ));
        if (e - lx0) as i64 % 2 == 0 || lx1 - lx0 <= 12.0 {
            s.push_str(&format!(
                "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"end\" transform=\"rotate(-40 {x:.1} {:.1})\">{}</text>\n",
                TOP + ph + 16.0,
                TOP + ph + 16.0,
                esc(&size_label(2f64.powf(e) as u64))
            ));
        }
        e += 1.0;
    }
    // y
    let mut yticks: Vec<f64> = Vec::new();
    if c.log_y {
        let mut d = ly0;
        while d <= ly1 + 1e-9 {
            for m in [1.0, 2.0, 5.0] {
                let v = 10f64.powf(d) * m;
                if v.log10() <= ly1 + 1e-9 {
                    yticks.push(v);
                }
            }
            d += 1.0;
        }
    } else {
        let mut v = 0.0;
        while v <= lin_max + step * 1e-6 {
            yticks.push(v);
            v += step;
        }
    }
    for v in yticks {
        let y = py(v);
        s.push_str(&format!(
            "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#e0e0e0\"/>\n",
            LEFT + pw
        ));
        s.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            LEFT - 6.0,
            y + 4.0,
            fmt_tick(v)
        ));
    }
    // axes and labels
    s.push_str(&format!(
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"black\"/>\n"
    ));
    s.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
        LEFT + pw / 2.0,
        H - 10.0,
        esc(&c.x_label)
    ));
    s.push_str(&format!(
        "<text x=\"18\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {:.1})\">{}</text>\n",
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        esc(&c.y_label)
    ));
    // series and legend
    for (i, ser) in c.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut pts: Vec<(f64, f64)> = ser.points.iter().copied().filter(usable).collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        if pts.len() > 1 {
            let path: Vec<String> = pts
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                .collect();
            s.push_str(&format!(
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n",
                path.join(" ")
            ));
        }
        for &(x, y) in &pts {
            s.push_str(&format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"/>\n",
                px(x),
                py(y)
            ));
        }
        let ly = TOP + 10.0 + 34.0 * i as f64;
        let lx = LEFT + pw + 15.0;
        s.push_str(&format!(
            "<line x1=\"{lx:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{color}\" stroke-width=\"3\"/>\n",
            lx + 20.0
        ));
        let name = if pts.is_empty() {
            format!("{} (no data)", ser.name)
        } else {
            ser.name.clone()
        };
        s.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
            lx + 26.0,
            ly + 4.0,
            esc(&name)
        ));
        if !ser.detail.is_empty() {
            s.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" fill=\"#555\">{}</text>\n",
                lx + 26.0,
                ly + 17.0,
                esc(&ser.detail)
            ));
        }
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(log_y: bool) -> Chart {
        Chart {
            title: "Bandwidth <vs> size".into(),
            x_label: "message size".into(),
            y_label: "GB/s".into(),
            log_y,
            series: vec![
                Series {
                    name: "uiw & co".into(),
                    detail: "requester".into(),
                    points: vec![(2.0, 0.01), (1024.0, 1.0), (8388608.0, 4.2)],
                },
                Series {
                    name: "TCP".into(),
                    detail: String::new(),
                    points: vec![(8388608.0, 9.0), (2.0, 0.02)],
                },
                Series {
                    name: "UCX".into(),
                    detail: String::new(),
                    points: vec![],
                },
            ],
        }
    }

    fn attr(tag: &str, name: &str) -> f64 {
        let k = format!("{name}=\"");
        let i = tag.find(&k).unwrap() + k.len();
        tag[i..].split('"').next().unwrap().parse().unwrap()
    }

    #[test]
    fn structure_legend_and_escaping() {
        let s = render(&chart(false));
        assert!(s.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(s.trim_end().ends_with("</svg>"));
        assert_eq!(
            s.matches("<polyline").count(),
            2,
            "the empty series draws no line"
        );
        assert_eq!(s.matches("<circle").count(), 5);
        assert!(s.contains("Bandwidth &lt;vs&gt; size"));
        assert!(s.contains(">uiw &amp; co<"));
        assert!(s.contains(">UCX (no data)<"));
        assert!(s.contains(">requester</text>"));
        assert!(s.contains(">message size<") && s.contains(">GB/s<"));
        assert!(s.contains(">8 MiB<") && s.contains(">2 B<"));
    }

    #[test]
    fn log_x_positions() {
        let s = render(&chart(false));
        let circles: Vec<&str> = s
            .lines()
            .filter(|l| l.starts_with("<circle"))
            .take(3)
            .collect();
        let xs: Vec<f64> = circles.iter().map(|c| attr(c, "cx")).collect();
        // 2 → 1024 is 9 octaves, 1024 → 8 MiB is 13: distances in that ratio
        let r = (xs[1] - xs[0]) / (xs[2] - xs[1]);
        assert!((r - 9.0 / 13.0).abs() < 0.01, "{r}");
        assert_eq!(xs[0], LEFT);
        assert_eq!(xs[2], W - RIGHT);
        // linear y: 0 at the bottom, bigger values higher
        let ys: Vec<f64> = circles.iter().map(|c| attr(c, "cy")).collect();
        assert!(ys[0] > ys[1] && ys[1] > ys[2]);
    }

    #[test]
    fn log_y_ticks_by_decade() {
        let s = render(&chart(true));
        for t in [">0.01<", ">0.1<", ">1<", ">10<"] {
            assert!(s.contains(t), "missing tick {t}");
        }
    }

    #[test]
    fn steps() {
        assert_eq!(nice_step(10.0, 5.0), 2.0);
        assert_eq!(nice_step(4.2, 5.0), 1.0);
        assert_eq!(nice_step(0.9, 5.0), 0.2);
        assert_eq!(nice_step(0.0, 5.0), 1.0);
        assert_eq!(fmt_tick(0.2), "0.2");
        assert_eq!(fmt_tick(10.0), "10");
    }
}
