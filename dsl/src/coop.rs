//! Cooperative matrices (`features(cooperative_matrix)`): how their operations print for a
//! device with them (WGSL's `coop_mat16x16` built-ins, `enable wgpu_cooperative_matrix;`) and
//! for the stand-in that runs the same kernel anywhere else, lavapipe included, so that a
//! kernel's tile walk is tested where no matrix core is.
//!
//! In the stand-in the 256 values of an accumulator are spread over the subgroup as a matrix
//! core spreads them (invocation `l` of `size` holds elements `l, l + size, …` of the 16×16 tile,
//! row by row, in an `array<f32, 64>`: WGSL subgroups have at least four invocations); an
//! operand is where it lies (`vec2(offset, stride)` into its workgroup array), read by the
//! multiply-add, which computes each invocation's elements as sixteen products in order, and
//! the store writes each invocation's own. So an operand's array must not change between its
//! load and its multiply-add (a kernel stages, waits at a barrier, then loads and multiplies),
//! and a kernel loads its `A` operands from one array and its `B` operands from one. The
//! result is the native operation's wherever its sums are exact — integer codes, which is what
//! kernels use it for. Its loops are not unrolled: lavapipe compiles it in a second.

use crate::ir::CoopOp;

/// What a kernel's WGSL is printed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The device's WGSL: cooperative-matrix operations are WGSL's built-ins.
    Native,
    /// The stand-in's: they are calls of the functions [`stand_in_functions`] writes.
    StandIn,
}

/// The WGSL type of an accumulator in the stand-in: an invocation's share of the 256 values.
const SHARE: &str = "array<f32, 64>";

impl Target {
    /// The operation `op` applied to its printed `args` (an array operand first, by name).
    pub fn coop(self, op: CoopOp, args: &[String]) -> String {
        match (self, op) {
            (Target::Native, CoopOp::Zero) => "coop_mat16x16<f32, C>()".into(),
            (Target::Native, CoopOp::LoadARows) => format!(
                "coopLoadT<coop_mat16x16<f16, A>>(&{}[{}], {})",
                args[0], args[1], args[2]
            ),
            (Target::Native, CoopOp::LoadBColumns) => format!(
                "coopLoad<coop_mat16x16<f16, B>>(&{}[{}], {})",
                args[0], args[1], args[2]
            ),
            (Target::Native, CoopOp::MultiplyAdd) => {
                format!("coopMultiplyAdd({}, {}, {})", args[0], args[1], args[2])
            }
            (Target::Native, CoopOp::StoreColumns) => {
                format!(
                    "coopStore({}, &{}[{}], {})",
                    args[0], args[1], args[2], args[3]
                )
            }
            (Target::StandIn, CoopOp::Zero) => format!("{SHARE}()"),
            (Target::StandIn, CoopOp::LoadARows | CoopOp::LoadBColumns) => {
                format!("vec2<u32>({}, {})", args[1], args[2])
            }
            (Target::StandIn, CoopOp::MultiplyAdd) => format!(
                "coop_stand_in_multiply_add({}, {}, {}, sg_invocation, sg_size)",
                args[0], args[1], args[2]
            ),
            (Target::StandIn, CoopOp::StoreColumns) => format!(
                "coop_stand_in_store_columns_{}({}, {}, {}, sg_invocation, sg_size)",
                args[1], args[0], args[2], args[3]
            ),
        }
    }
}

/// The stand-in's multiply-add, reading its operands from the arrays the kernel loads `A`
/// and `B` from, and its store into each array `uses` stores to (`(operation, array)`): WGSL
/// cannot hand a workgroup array to a function, so each one names its arrays. Their own names
/// start with `coop_stand_in`, which a kernel may not use, so none hides a kernel's array.
pub fn stand_in_functions(uses: &[(CoopOp, String)]) -> String {
    let array = |op: CoopOp| uses.iter().find(|u| u.0 == op).map(|u| u.1.as_str());
    let mut out = String::new();
    if let (Some(a), Some(b)) = (array(CoopOp::LoadARows), array(CoopOp::LoadBColumns)) {
        out += &format!(
            "fn coop_stand_in_multiply_add(coop_stand_in_a: vec2<u32>, coop_stand_in_b: vec2<u32>, coop_stand_in_c: {SHARE}, coop_stand_in_lane: u32, coop_stand_in_size: u32) -> {SHARE} {{
    var coop_stand_in_share = coop_stand_in_c;
    for (var coop_stand_in_i = 0u; coop_stand_in_lane + coop_stand_in_i * coop_stand_in_size < 256u; coop_stand_in_i += 1u) {{
        let coop_stand_in_e = coop_stand_in_lane + coop_stand_in_i * coop_stand_in_size;
        let coop_stand_in_row = coop_stand_in_a.x + (coop_stand_in_e / 16u) * coop_stand_in_a.y;
        let coop_stand_in_column = coop_stand_in_b.x + (coop_stand_in_e % 16u) * coop_stand_in_b.y;
        var coop_stand_in_sum = coop_stand_in_share[coop_stand_in_i];
        for (var coop_stand_in_k = 0u; coop_stand_in_k < 16u; coop_stand_in_k += 1u) {{
            coop_stand_in_sum += f32({a}[coop_stand_in_row + coop_stand_in_k])
                * f32({b}[coop_stand_in_column + coop_stand_in_k]);
        }}
        coop_stand_in_share[coop_stand_in_i] = coop_stand_in_sum;
    }}
    return coop_stand_in_share;
}}
"
        );
    }
    for (_, array) in uses.iter().filter(|u| u.0 == CoopOp::StoreColumns) {
        out += &format!(
            "fn coop_stand_in_store_columns_{array}(coop_stand_in_c: {SHARE}, coop_stand_in_offset: u32, coop_stand_in_stride: u32, coop_stand_in_lane: u32, coop_stand_in_size: u32) {{
    var coop_stand_in_share = coop_stand_in_c;
    for (var coop_stand_in_i = 0u; coop_stand_in_lane + coop_stand_in_i * coop_stand_in_size < 256u; coop_stand_in_i += 1u) {{
        let coop_stand_in_e = coop_stand_in_lane + coop_stand_in_i * coop_stand_in_size;
        {array}[coop_stand_in_offset + (coop_stand_in_e % 16u) * coop_stand_in_stride
            + coop_stand_in_e / 16u] = coop_stand_in_share[coop_stand_in_i];
    }}
}}
"
        );
    }
    out
}
