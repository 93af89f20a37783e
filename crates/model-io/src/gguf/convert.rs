//! Undoing llama.cpp's converter: a GGUF tensor back to the Hugging Face tensor it was made from.
//!
//! convert_hf_to_gguf.py (llama.cpp 0c1e570, `conversion/qwen.py`) changes some tensors on the way:
//! for Qwen3.5 / Qwen3-Next it adds 1 to every `*norm.weight` except the GDN's `linear_attn.norm`
//! (llama.cpp then applies plain RMSNorm weights), stores `A = -exp(A_log)`, squeezes the conv1d
//! kernel `[C, 1, K]` to `[C, K]`, and, when a GDN has fewer key heads than value heads, reorders
//! the value heads from grouped `[Hk, Hv/Hk, d]` to tiled `[Hv/Hk, Hk, d]` order along the value
//! axis of `in_proj_qkv` (the V rows), `in_proj_z`, `in_proj_a`, `in_proj_b`, `A_log`, `dt_bias`,
//! the conv1d channels after Q and K, and the columns of `out_proj`. Qwen3 (dense) tensors are
//! stored unchanged (no Q/K rope permutation: Qwen uses NEOX rope, which llama.cpp runs as is).
//!
//! Qwen3-Next keeps grouped value heads but splits `in_proj_qkvz` into `attn_qkv` + `attn_gate`
//! (exactly Qwen3.5's `in_proj_qkv` / `in_proj_z`) and keeps `in_proj_ba` fused per key head
//! (`ssm_ba`: `[b_g (r), a_g (r)]` for each key head g, r = Hv/Hk), which
//! [`Transform::TakeGroupRows`] splits into `in_proj_b` and `in_proj_a`.
//!
//! Each [`Transform`] inverts one such change on the dequantized f32 values, laid out row-major in
//! the Hugging Face shape. Exactness: reordering and reshaping move values unchanged. `w - 1` is
//! exact for every stored `s = 1 + w >= 0.5` (Sterbenz), and the family adds the 1 back, giving `s`
//! again: the same weight llama.cpp runs. `A_log = ln(-A)` is not exact: `-exp(ln(-A))` differs
//! from the stored `A` by a few ulp.
//!
//! Invariant: a transform keeps the element count (but `TakeGroupRows`, which leaves exactly the
//! output shape's elements) and never indexes outside the buffer (layouts are checked against the
//! buffer length first; a mismatch is an error, not a panic).

/// Where value heads sit in a tensor, for [`Transform::UngroupValueHeads`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadAxis {
    /// Along rows (dimension 0), starting at row `start`.
    Rows { start: usize },
    /// Along columns (the last dimension).
    Columns,
}

/// One inverse step, applied to f32 values in the Hugging Face shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transform {
    /// `w = s - 1` (zero-centred RMSNorm weights stored as `1 + w`).
    MinusOne,
    /// `A_log = ln(-A)`.
    LogOfNegated,
    /// Of `groups` consecutive groups of `group_rows` rows each, keep rows `start..start + len` of
    /// every group (the output has `groups * len` rows).
    TakeGroupRows {
        groups: usize,
        group_rows: usize,
        start: usize,
        len: usize,
    },
    /// Tiled `[Hv/Hk, Hk, d]` value heads back to grouped `[Hk, Hv/Hk, d]`.
    UngroupValueHeads {
        axis: HeadAxis,
        key_heads: usize,
        values_per_key: usize,
        head_dim: usize,
    },
}

impl Transform {
    /// Applies the inverse step to `values`, laid out row-major in `shape` (for `TakeGroupRows`,
    /// the shape after the step).
    pub fn apply(&self, values: &mut Vec<f32>, shape: &[usize]) -> Result<(), String> {
        match *self {
            Transform::MinusOne => values.iter_mut().for_each(|v| *v -= 1.0),
            Transform::LogOfNegated => values.iter_mut().for_each(|v| *v = (-*v).ln()),
            Transform::UngroupValueHeads {
                axis,
                key_heads,
                values_per_key,
                head_dim,
            } => ungroup(values, shape, axis, key_heads, values_per_key, head_dim)?,
            Transform::TakeGroupRows {
                groups,
                group_rows,
                start,
                len,
            } => {
                let rows = groups.checked_mul(group_rows).filter(|&r| r > 0);
                let row_len = rows.map_or(0, |r| values.len() / r);
                let fits = rows.is_some_and(|r| r * row_len == values.len())
                    && start.checked_add(len).is_some_and(|e| e <= group_rows)
                    && shape.iter().product::<usize>() == groups * len * row_len;
                if !fits {
                    return Err(format!(
                        "cannot take rows {start}..+{len} of {groups} groups of {group_rows} rows from {} values into shape {shape:?}",
                        values.len()
                    ));
                }
                let kept: Vec<f32> = values
                    .chunks_exact(group_rows * row_len)
                    .flat_map(|g| &g[start * row_len..(start + len) * row_len])
                    .copied()
                    .collect();
                *values = kept;
            }
        }
        Ok(())
    }
}

/// The index map of one value axis: HF position `(g, j, d)` reads tiled position `(j, g, d)`.
fn ungroup(
    values: &mut [f32],
    shape: &[usize],
    axis: HeadAxis,
    key_heads: usize,
    values_per_key: usize,
    head_dim: usize,
) -> Result<(), String> {
    let span = key_heads
        .checked_mul(values_per_key)
        .and_then(|n| n.checked_mul(head_dim))
        .ok_or("value head layout overflows")?;
    let rows = shape.first().copied().unwrap_or(1);
    let row_len = values.len().checked_div(rows).unwrap_or(0);
    let source_of = |hf: usize| {
        let (g, rest) = (
            hf / (values_per_key * head_dim),
            hf % (values_per_key * head_dim),
        );
        let (j, d) = (rest / head_dim, rest % head_dim);
        (j * key_heads + g) * head_dim + d
    };
    match axis {
        HeadAxis::Rows { start } => {
            // Rows start..start+span are value rows of row_len elements each.
            let end = start.checked_add(span).filter(|&e| e <= rows);
            if end.is_none() || rows * row_len != values.len() {
                return Err(format!(
                    "value heads {key_heads}x{values_per_key}x{head_dim} from row {start} do not fit shape {shape:?}"
                ));
            }
            let region = &mut values[start * row_len..(start + span) * row_len];
            let tiled = region.to_vec();
            for hf in 0..span {
                let src = source_of(hf);
                region[hf * row_len..(hf + 1) * row_len]
                    .copy_from_slice(&tiled[src * row_len..(src + 1) * row_len]);
            }
        }
        HeadAxis::Columns => {
            if row_len != span || rows * row_len != values.len() {
                return Err(format!(
                    "value heads {key_heads}x{values_per_key}x{head_dim} do not span the columns of shape {shape:?}"
                ));
            }
            let mut tiled = vec![0f32; span];
            for row in values.chunks_exact_mut(row_len) {
                tiled.copy_from_slice(row);
                for (hf, v) in row.iter_mut().enumerate() {
                    *v = tiled[source_of(hf)];
                }
            }
        }
    }
    Ok(())
}

/// Where a quantized matrix's Hugging Face rows and input columns sit in the stored tensor: `rows[r]` is
/// the stored row of row r; `columns`, when the columns were reordered, the input element of each stored
/// column (`x_stored[c] = x[columns[c]]`).
#[derive(Debug, PartialEq)]
pub struct BlockOrder {
    pub rows: Vec<usize>,
    pub columns: Option<Vec<usize>>,
}

/// The inverse `transforms` of a [rows, cols] matrix stored as `stored_rows` rows, as whole-row moves
/// and an input permutation (the blocks themselves are never split); None when a transform changes
/// values (`MinusOne`, `LogOfNegated`: never a weight matrix's).
pub fn block_order(
    transforms: &[Transform],
    stored_rows: usize,
    rows: usize,
    cols: usize,
) -> Result<Option<BlockOrder>, String> {
    // Each transform applied to the index vectors gives, per Hugging Face position, the stored one.
    let mut row_of: Vec<f32> = (0..stored_rows).map(|r| r as f32).collect();
    let mut col_of: Option<Vec<f32>> = None;
    if stored_rows >= 1 << 24 || cols >= 1 << 24 {
        return Err(format!("{stored_rows} x {cols} is too large to reorder"));
    }
    for t in transforms {
        match t {
            Transform::MinusOne | Transform::LogOfNegated => return Ok(None),
            Transform::TakeGroupRows { .. } => t.apply(&mut row_of, &[rows, 1])?,
            Transform::UngroupValueHeads {
                axis: HeadAxis::Rows { .. },
                ..
            } => {
                let shape = [row_of.len(), 1];
                t.apply(&mut row_of, &shape)?
            }
            Transform::UngroupValueHeads {
                axis: HeadAxis::Columns,
                ..
            } => {
                let cols_now = col_of.get_or_insert_with(|| (0..cols).map(|c| c as f32).collect());
                t.apply(cols_now, &[1, cols])?;
            }
        }
    }
    if row_of.len() != rows {
        return Err(format!(
            "{stored_rows} stored rows give {} rows, the shape has {rows}",
            row_of.len()
        ));
    }
    let columns = col_of.map(|stored_of_hf| {
        // stored_of_hf[h] is the stored column holding Hugging Face column h.
        let mut input_of_stored = vec![0usize; cols];
        for (h, &c) in stored_of_hf.iter().enumerate() {
            input_of_stored[c as usize] = h;
        }
        input_of_stored
    });
    Ok(Some(BlockOrder {
        rows: row_of.iter().map(|&r| r as usize).collect(),
        columns,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The converter's `_reorder_v_heads` on one axis: grouped [Hk, r, d] -> tiled [r, Hk, d].
    fn tile(x: &[f32], hk: usize, r: usize, d: usize) -> Vec<f32> {
        let mut out = vec![0.0; x.len()];
        for g in 0..hk {
            for j in 0..r {
                for k in 0..d {
                    out[(j * hk + g) * d + k] = x[(g * r + j) * d + k];
                }
            }
        }
        out
    }

    /// Reordering whole rows and the inputs gives the product of the dequantized, transformed matrix.
    #[test]
    fn block_order_matches_the_value_transforms() {
        let (hk, r, d) = (2, 2, 2);
        let n = hk * r * d; // 8

        // A [n, n] matrix stored tiled along rows (from row 0) and along columns.
        let stored: Vec<f32> = (0..n * n).map(|i| (i * 7 % 23) as f32).collect();
        let rows_t = Transform::UngroupValueHeads {
            axis: HeadAxis::Rows { start: 0 },
            key_heads: hk,
            values_per_key: r,
            head_dim: d,
        };
        let cols_t = Transform::UngroupValueHeads {
            axis: HeadAxis::Columns,
            key_heads: hk,
            values_per_key: r,
            head_dim: d,
        };
        let mut hf = stored.clone();
        rows_t.apply(&mut hf, &[n, n]).unwrap();
        cols_t.apply(&mut hf, &[n, n]).unwrap();
        let order = block_order(&[rows_t, cols_t], n, n, n).unwrap().unwrap();
        let x: Vec<f32> = (0..n).map(|i| 1.0 + i as f32).collect();
        let input = order.columns.as_ref().unwrap();
        for row in 0..n {
            let want: f32 = (0..n).map(|c| hf[row * n + c] * x[c]).sum();
            let s = order.rows[row];
            let got: f32 = (0..n).map(|c| stored[s * n + c] * x[input[c]]).sum();
            assert_eq!(got, want, "row {row}");
        }
        let take = Transform::TakeGroupRows {
            groups: 2,
            group_rows: 3,
            start: 1,
            len: 2,
        };
        let order = block_order(&[take], 6, 4, 5).unwrap().unwrap();
        assert_eq!(order.rows, [1, 2, 4, 5]);
        assert_eq!(block_order(&[Transform::MinusOne], 1, 1, 1).unwrap(), None);
    }

    #[test]
    fn ungroup_inverts_the_converter_on_rows_and_columns() {
        let (hk, r, d) = (2, 3, 2);
        let n = hk * r * d;
        let original: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let mut rows = tile(&original, hk, r, d);
        let mut grouped: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let take = Transform::TakeGroupRows {
            groups: 2,
            group_rows: 3,
            start: 1,
            len: 2,
        };
        take.apply(&mut grouped, &[4, 2]).unwrap();
        assert_eq!(grouped, [2.0, 3.0, 4.0, 5.0, 8.0, 9.0, 10.0, 11.0]);
        let t = Transform::UngroupValueHeads {
            axis: HeadAxis::Rows { start: 0 },
            key_heads: hk,
            values_per_key: r,
            head_dim: d,
        };
        t.apply(&mut rows, &[n]).unwrap();
        assert_eq!(rows, original);
        // Columns of a 2-row matrix, each row tiled independently.
        let mut cols: Vec<f32> = tile(&original, hk, r, d);
        cols.extend(tile(&original, hk, r, d));
        let t = Transform::UngroupValueHeads {
            axis: HeadAxis::Columns,
            key_heads: hk,
            values_per_key: r,
            head_dim: d,
        };
        t.apply(&mut cols, &[2, n]).unwrap();
        assert_eq!(&cols[..n], &original[..]);
        assert_eq!(&cols[n..], &original[..]);
        // A layout that does not fit is an error.
        assert!(t.apply(&mut cols, &[3, 8]).is_err());
    }
}
