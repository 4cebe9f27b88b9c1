//! A small GGUF writer for the tests: builds valid files, and records where each field landed so
//! that a test can break one field and check that the error points at it.

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use ch01::GgmlType;
use ch01::gguf::{Value, ValueType};

pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub data: Vec<u8>,
    /// Offset in the data section; `None` places it after the previous tensor, aligned.
    pub offset: Option<u64>,
}

/// Where the writer put things, as byte offsets from the start of the file.
#[derive(Debug, Default, Clone)]
pub struct Layout {
    /// Start of each metadata entry (its key's length field).
    pub kv: Vec<u64>,
    /// Start of each tensor info (its name's length field).
    pub tensor_info: Vec<u64>,
    /// Position of each tensor info's `n_dims` field.
    pub n_dims_field: Vec<u64>,
    /// Position of each tensor info's type field.
    pub type_field: Vec<u64>,
    /// Position of each tensor info's offset field.
    pub offset_field: Vec<u64>,
    /// End of the tensor infos, before padding.
    pub end_of_infos: u64,
    pub data_offset: u64,
    /// Every length, count and type field: `(position, width in bytes)`.
    pub fields: Vec<(u64, u8)>,
}

pub struct Builder {
    pub version: u32,
    pub kvs: Vec<(String, Value)>,
    pub tensors: Vec<TensorSpec>,
    /// Padding the writer uses; set `general.alignment` through [`Builder::alignment`].
    pub align: u64,
}

impl Default for Builder {
    fn default() -> Self {
        Builder::new()
    }
}

impl Builder {
    pub fn new() -> Builder {
        Builder {
            version: 3,
            kvs: vec![],
            tensors: vec![],
            align: 32,
        }
    }

    pub fn version(mut self, v: u32) -> Builder {
        self.version = v;
        self
    }

    pub fn kv(mut self, key: &str, value: Value) -> Builder {
        self.kvs.push((key.to_string(), value));
        self
    }

    pub fn alignment(mut self, a: u32) -> Builder {
        self.align = a.into();
        self.kv("general.alignment", Value::U32(a))
    }

    pub fn tensor(self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> Builder {
        self.tensor_spec(name, dims, ty, data, None)
    }

    pub fn tensor_at(
        self,
        name: &str,
        dims: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
        offset: u64,
    ) -> Builder {
        self.tensor_spec(name, dims, ty, data, Some(offset))
    }

    fn tensor_spec(
        mut self,
        name: &str,
        dims: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
        offset: Option<u64>,
    ) -> Builder {
        self.tensors.push(TensorSpec {
            name: name.to_string(),
            dims: dims.to_vec(),
            ty,
            data,
            offset,
        });
        self
    }

    pub fn build(&self) -> Vec<u8> {
        self.build_with_layout().0
    }

    pub fn build_with_layout(&self) -> (Vec<u8>, Layout) {
        let mut w = Writer::default();
        w.out.extend_from_slice(b"GGUF");
        w.u32(self.version);
        w.field(8);
        w.u64(self.tensors.len() as u64);
        w.field(8);
        w.u64(self.kvs.len() as u64);
        for (key, value) in &self.kvs {
            w.layout.kv.push(w.pos());
            w.string(key);
            w.field(4);
            w.u32(value.value_type() as u32);
            w.value(value);
        }
        let align = self.align.max(1);
        let mut next = 0u64;
        let mut offsets = vec![];
        for t in &self.tensors {
            let offset = t.offset.unwrap_or_else(|| next.next_multiple_of(align));
            next = offset + t.data.len() as u64;
            offsets.push(offset);
            w.layout.tensor_info.push(w.pos());
            w.string(&t.name);
            w.layout.n_dims_field.push(w.pos());
            w.field(4);
            w.u32(t.dims.len() as u32);
            for &d in &t.dims {
                w.field(8);
                w.u64(d);
            }
            w.layout.type_field.push(w.pos());
            w.field(4);
            w.u32(t.ty.id());
            w.layout.offset_field.push(w.pos());
            w.field(8);
            w.u64(offset);
        }
        w.layout.end_of_infos = w.pos();
        if !self.tensors.is_empty() {
            let data_offset = w.pos().next_multiple_of(align);
            w.out.resize(data_offset as usize, 0);
            w.layout.data_offset = data_offset;
            let data_len = self
                .tensors
                .iter()
                .zip(&offsets)
                .map(|(t, &o)| o + t.data.len() as u64)
                .max()
                .unwrap_or(0);
            w.out.resize((data_offset + data_len) as usize, 0);
            for (t, &o) in self.tensors.iter().zip(&offsets) {
                let start = (data_offset + o) as usize;
                w.out[start..start + t.data.len()].copy_from_slice(&t.data);
            }
        } else {
            w.layout.data_offset = w.pos();
        }
        (w.out, w.layout)
    }
}

#[derive(Default)]
struct Writer {
    out: Vec<u8>,
    layout: Layout,
}

impl Writer {
    fn pos(&self) -> u64 {
        self.out.len() as u64
    }
    fn field(&mut self, width: u8) {
        let p = self.pos();
        self.layout.fields.push((p, width));
    }
    fn u32(&mut self, v: u32) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    fn string(&mut self, s: &str) {
        self.field(8);
        self.u64(s.len() as u64);
        self.out.extend_from_slice(s.as_bytes());
    }
    fn value(&mut self, v: &Value) {
        match v {
            Value::U8(x) => self.out.push(*x),
            Value::I8(x) => self.out.extend_from_slice(&x.to_le_bytes()),
            Value::U16(x) => self.out.extend_from_slice(&x.to_le_bytes()),
            Value::I16(x) => self.out.extend_from_slice(&x.to_le_bytes()),
            Value::U32(x) => self.out.extend_from_slice(&x.to_le_bytes()),
            Value::I32(x) => self.out.extend_from_slice(&x.to_le_bytes()),
            Value::U64(x) => self.out.extend_from_slice(&x.to_le_bytes()),
            Value::I64(x) => self.out.extend_from_slice(&x.to_le_bytes()),
            Value::F32(x) => self.out.extend_from_slice(&x.to_le_bytes()),
            Value::F64(x) => self.out.extend_from_slice(&x.to_le_bytes()),
            Value::Bool(x) => self.out.push(*x as u8),
            Value::String(s) => self.string(s),
            Value::Array(ty, items) => {
                self.field(4);
                self.u32(*ty as u32);
                self.field(8);
                self.u64(items.len() as u64);
                for item in items {
                    assert_eq!(item.value_type(), *ty, "array elements must have its type");
                    self.value(item);
                }
            }
        }
    }
}

/// Little-endian bytes of f32 values.
pub fn f32_bytes(xs: &[f32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn strings(xs: &[&str]) -> Value {
    Value::Array(
        ValueType::String,
        xs.iter().map(|s| Value::String(s.to_string())).collect(),
    )
}

/// A small file with every value type, nested and empty arrays, and tensors of four types.
pub fn sample() -> Builder {
    let q8_0: Vec<u8> = (0..2)
        .flat_map(|b| {
            let mut block = half::f16::from_f32(0.25 * (b + 1) as f32)
                .to_le_bytes()
                .to_vec();
            block.extend((0..32).map(|i| (i as i8 - 16) as u8));
            block
        })
        .collect();
    let mut q4_1 = half::f16::from_f32(0.5).to_le_bytes().to_vec();
    q4_1.extend(half::f16::from_f32(-2.0).to_le_bytes());
    q4_1.extend((0..16u8).map(|j| j | (15 - j) << 4));
    let f16: Vec<u8> = (0..6)
        .flat_map(|i| half::f16::from_f32(i as f32 - 2.5).to_le_bytes())
        .collect();
    Builder::new()
        .kv("general.architecture", Value::String("llama".into()))
        .kv("general.name", Value::String("tiny ✓".into()))
        .kv("test.u8", Value::U8(200))
        .kv("test.i8", Value::I8(-100))
        .kv("test.u16", Value::U16(60000))
        .kv("test.i16", Value::I16(-30000))
        .kv("test.u32", Value::U32(4_000_000_000))
        .kv("test.i32", Value::I32(-2_000_000_000))
        .kv("test.u64", Value::U64(1 << 40))
        .kv("test.i64", Value::I64(-(1 << 40)))
        .kv("test.f32", Value::F32(1e-5))
        .kv("test.f64", Value::F64(-0.125))
        .kv("test.bool", Value::Bool(true))
        .kv("test.strings", strings(&["a", "", "Ġthe", "<|im_end|>"]))
        .kv(
            "test.i32s",
            Value::Array(ValueType::I32, vec![Value::I32(-1), Value::I32(7)]),
        )
        .kv(
            "test.nested",
            Value::Array(
                ValueType::Array,
                vec![
                    Value::Array(ValueType::U8, vec![Value::U8(1), Value::U8(2)]),
                    Value::Array(ValueType::String, vec![Value::String("x".into())]),
                    Value::Array(ValueType::F32, vec![]),
                ],
            ),
        )
        .kv("test.empty", Value::Array(ValueType::U64, vec![]))
        .tensor(
            "norm.weight",
            &[4],
            GgmlType::F32,
            f32_bytes(&[1.0, -2.0, 0.5, 3.25]),
        )
        .tensor("embd.weight", &[32, 2], GgmlType::Q8_0, q8_0)
        .tensor("proj.weight", &[32], GgmlType::Q4_1, q4_1)
        .tensor("half.weight", &[3, 2], GgmlType::F16, f16)
        .tensor("empty.weight", &[0, 3], GgmlType::F32, vec![])
}
