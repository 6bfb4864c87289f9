//! A small, safe Python pickle reader (protocols 0-5) for PyTorch checkpoints: it builds a
//! value graph without executing anything, so a hostile or damaged file yields an error, never
//! code execution or a panic. Lists, dicts and objects are shared (`Rc`) so memo references see
//! later mutations, as in Python.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Where a tensor's bytes live inside the checkpoint archive.
#[derive(Debug, Clone, PartialEq)]
pub struct StorageRef {
    /// `FloatStorage`, `HalfStorage`, ...
    pub kind: String,
    /// Entry name under `<archive>/data/`.
    pub key: String,
    /// Number of elements of the storage.
    pub numel: usize,
}

/// A tensor as described by `torch._utils._rebuild_tensor_v2`.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorRef {
    pub storage: StorageRef,
    pub offset: usize,
    pub shape: Vec<usize>,
    pub stride: Vec<usize>,
}

/// A Python object instance (class, constructor arguments, state set by BUILD).
#[derive(Debug)]
pub struct Instance {
    pub module: String,
    pub name: String,
    pub args: Value,
    pub state: RefCell<Value>,
}

#[derive(Debug, Clone)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Rc<Vec<Value>>),
    List(Rc<RefCell<Vec<Value>>>),
    Dict(Rc<RefCell<Vec<(Value, Value)>>>),
    Global(Rc<(String, String)>),
    Object(Rc<Instance>),
    Tensor(Rc<TensorRef>),
    Storage(Rc<StorageRef>),
    Mark,
}

impl Value {
    fn list(v: Vec<Value>) -> Self {
        Value::List(Rc::new(RefCell::new(v)))
    }
    fn dict(v: Vec<(Value, Value)>) -> Self {
        Value::Dict(Rc::new(RefCell::new(v)))
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
    /// Items of a tuple or list.
    pub fn items(&self) -> Option<Vec<Value>> {
        match self {
            Value::Tuple(t) => Some(t.as_ref().clone()),
            Value::List(l) => Some(l.borrow().clone()),
            _ => None,
        }
    }
    /// Looks a string key up in a dict.
    pub fn get(&self, key: &str) -> Option<Value> {
        match self {
            Value::Dict(d) => d.borrow().iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v.clone()),
            _ => None,
        }
    }
    /// Key/value pairs of a dict.
    pub fn pairs(&self) -> Option<Vec<(Value, Value)>> {
        match self {
            Value::Dict(d) => Some(d.borrow().clone()),
            _ => None,
        }
    }
    /// An attribute of an object (its `__dict__` entry), or a key of a dict.
    pub fn attr(&self, key: &str) -> Option<Value> {
        match self {
            Value::Object(o) => o.state.borrow().get(key),
            Value::Dict(_) => self.get(key),
            _ => None,
        }
    }
    pub fn class_name(&self) -> Option<String> {
        match self {
            Value::Object(o) => Some(format!("{}.{}", o.module, o.name)),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PickleError {
    #[error("pickle data ends early (truncated file?)")]
    Eof,
    #[error("unsupported or invalid pickle opcode 0x{0:02x} at byte {1}")]
    Opcode(u8, usize),
    #[error("malformed pickle at byte {pos}: {msg}")]
    Malformed { pos: usize, msg: String },
}

const MAX_LEN: usize = 1 << 31;

/// Parses a pickle stream into a value graph.
pub fn parse(data: &[u8]) -> Result<Value, PickleError> {
    Machine { data, pos: 0, stack: Vec::new(), marks: Vec::new(), memo: HashMap::new() }.run()
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: HashMap<u64, Value>,
}

impl<'a> Machine<'a> {
    fn bad<T>(&self, msg: impl Into<String>) -> Result<T, PickleError> {
        Err(PickleError::Malformed { pos: self.pos, msg: msg.into() })
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        if n > MAX_LEN || self.pos + n > self.data.len() {
            return Err(PickleError::Eof);
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }
    fn le(&mut self, n: usize) -> Result<u64, PickleError> {
        let b = self.take(n)?;
        Ok(b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | x as u64))
    }
    fn line(&mut self) -> Result<&'a str, PickleError> {
        let rest = &self.data[self.pos..];
        let n = rest.iter().position(|&b| b == b'\n').ok_or(PickleError::Eof)?;
        let s = std::str::from_utf8(&rest[..n]).map_err(|_| PickleError::Malformed { pos: self.pos, msg: "non-UTF-8 text".into() })?;
        self.pos += n + 1;
        Ok(s)
    }
    fn pop(&mut self) -> Result<Value, PickleError> {
        match self.stack.pop() {
            Some(v) => Ok(v),
            None => self.bad("stack underflow"),
        }
    }
    fn top(&mut self) -> Result<&mut Value, PickleError> {
        if self.stack.is_empty() {
            return self.bad("stack underflow");
        }
        Ok(self.stack.last_mut().unwrap())
    }
    fn pop_mark(&mut self) -> Result<Vec<Value>, PickleError> {
        let Some(m) = self.marks.pop() else { return self.bad("no mark") };
        if m > self.stack.len() {
            return self.bad("mark beyond stack");
        }
        Ok(self.stack.split_off(m))
    }
    fn string(&self, b: &[u8]) -> Result<Value, PickleError> {
        match std::str::from_utf8(b) {
            Ok(s) => Ok(Value::Str(s.to_string())),
            Err(_) => self.bad("invalid UTF-8 string"),
        }
    }
    fn memo_get(&self, k: u64) -> Result<Value, PickleError> {
        match self.memo.get(&k) {
            Some(v) => Ok(v.clone()),
            None => self.bad(format!("memo key {k} missing")),
        }
    }
    fn memo_put(&mut self, k: u64) -> Result<(), PickleError> {
        let v = self.top()?.clone();
        self.memo.insert(k, v);
        Ok(())
    }

    fn run(mut self) -> Result<Value, PickleError> {
        loop {
            let at = self.pos;
            let op = self.u8()?;
            match op {
                b'.' => return self.pop(), // STOP
                0x80 => {
                    self.u8()?;
                } // PROTO
                0x95 => {
                    self.le(8)?;
                } // FRAME
                b'(' => self.marks.push(self.stack.len()), // MARK
                b'0' => {
                    self.pop()?;
                } // POP
                b'1' => {
                    self.pop_mark()?;
                } // POP_MARK
                b'2' => {
                    let v = self.top()?.clone();
                    self.stack.push(v);
                } // DUP
                b'N' => self.stack.push(Value::None),
                0x88 => self.stack.push(Value::Bool(true)),
                0x89 => self.stack.push(Value::Bool(false)),
                b'J' => {
                    let v = self.le(4)? as u32 as i32;
                    self.stack.push(Value::Int(v as i64));
                }
                b'K' => {
                    let v = self.le(1)?;
                    self.stack.push(Value::Int(v as i64));
                }
                b'M' => {
                    let v = self.le(2)?;
                    self.stack.push(Value::Int(v as i64));
                }
                0x8a | 0x8b => {
                    // LONG1 / LONG4
                    let n = if op == 0x8a { self.le(1)? } else { self.le(4)? } as usize;
                    let b = self.take(n)?;
                    if n > 8 {
                        self.stack.push(Value::Int(i64::MAX));
                        continue;
                    }
                    let mut v: i64 = 0;
                    for (i, &x) in b.iter().enumerate() {
                        v |= (x as i64) << (8 * i);
                    }
                    if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
                        v -= 1i64 << (8 * n);
                    }
                    self.stack.push(Value::Int(v));
                }
                b'I' | b'L' => {
                    // INT / LONG (text)
                    let s = self.line()?.trim_end_matches('L');
                    let v = match s {
                        "00" => Value::Bool(false),
                        "01" => Value::Bool(true),
                        _ => Value::Int(s.parse().unwrap_or(0)),
                    };
                    self.stack.push(v);
                }
                b'F' => {
                    let s = self.line()?;
                    self.stack.push(Value::Float(s.parse().unwrap_or(f64::NAN)));
                }
                b'G' => {
                    let b = self.take(8)?;
                    self.stack.push(Value::Float(f64::from_be_bytes(b.try_into().unwrap())));
                }
                b'X' => {
                    let n = self.le(4)? as usize;
                    let b = self.take(n)?;
                    let v = self.string(b)?;
                    self.stack.push(v);
                }
                0x8c => {
                    let n = self.le(1)? as usize;
                    let b = self.take(n)?;
                    let v = self.string(b)?;
                    self.stack.push(v);
                }
                0x8d => {
                    let n = self.le(8)? as usize;
                    let b = self.take(n)?;
                    let v = self.string(b)?;
                    self.stack.push(v);
                }
                b'V' => {
                    let s = self.line()?.to_string();
                    self.stack.push(Value::Str(s));
                }
                b'S' => {
                    let s = self.line()?.trim_matches(|c| c == '\'' || c == '"').to_string();
                    self.stack.push(Value::Str(s));
                }
                b'T' => {
                    let n = self.le(4)? as usize;
                    let b = self.take(n)?.to_vec();
                    self.stack.push(Value::Bytes(b));
                }
                b'U' => {
                    let n = self.le(1)? as usize;
                    let b = self.take(n)?.to_vec();
                    self.stack.push(Value::Bytes(b));
                }
                b'B' => {
                    let n = self.le(4)? as usize;
                    let b = self.take(n)?.to_vec();
                    self.stack.push(Value::Bytes(b));
                }
                b'C' => {
                    let n = self.le(1)? as usize;
                    let b = self.take(n)?.to_vec();
                    self.stack.push(Value::Bytes(b));
                }
                0x8e | 0x96 => {
                    let n = self.le(8)? as usize;
                    let b = self.take(n)?.to_vec();
                    self.stack.push(Value::Bytes(b));
                }
                b')' => self.stack.push(Value::Tuple(Rc::new(vec![]))),
                b't' => {
                    let v = self.pop_mark()?;
                    self.stack.push(Value::Tuple(Rc::new(v)));
                }
                0x85 => {
                    let a = self.pop()?;
                    self.stack.push(Value::Tuple(Rc::new(vec![a])));
                }
                0x86 => {
                    let b = self.pop()?;
                    let a = self.pop()?;
                    self.stack.push(Value::Tuple(Rc::new(vec![a, b])));
                }
                0x87 => {
                    let c = self.pop()?;
                    let b = self.pop()?;
                    let a = self.pop()?;
                    self.stack.push(Value::Tuple(Rc::new(vec![a, b, c])));
                }
                b']' => self.stack.push(Value::list(vec![])),
                b'l' => {
                    let v = self.pop_mark()?;
                    self.stack.push(Value::list(v));
                }
                b'}' => self.stack.push(Value::dict(vec![])),
                b'd' => {
                    let v = self.pop_mark()?;
                    if v.len() % 2 != 0 {
                        return self.bad("odd number of dict items");
                    }
                    let pairs = v.chunks(2).map(|c| (c[0].clone(), c[1].clone())).collect();
                    self.stack.push(Value::dict(pairs));
                }
                0x8f => self.stack.push(Value::list(vec![])), // EMPTY_SET (kept as a list)
                0x91 => {
                    let v = self.pop_mark()?;
                    self.stack.push(Value::list(v));
                } // FROZENSET
                b'a' => {
                    let v = self.pop()?;
                    self.append(vec![v])?;
                }
                b'e' | 0x90 => {
                    let v = self.pop_mark()?;
                    self.append(v)?;
                } // APPENDS / ADDITEMS
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.setitems(vec![k, v])?;
                }
                b'u' => {
                    let v = self.pop_mark()?;
                    self.setitems(v)?;
                }
                b'c' => {
                    let module = self.line()?.to_string();
                    let name = self.line()?.to_string();
                    self.stack.push(Value::Global(Rc::new((module, name))));
                }
                0x93 => {
                    // STACK_GLOBAL
                    let name = self.pop()?;
                    let module = self.pop()?;
                    match (module, name) {
                        (Value::Str(m), Value::Str(n)) => self.stack.push(Value::Global(Rc::new((m, n)))),
                        _ => return self.bad("STACK_GLOBAL needs two strings"),
                    }
                }
                b'R' => {
                    let args = self.pop()?;
                    let f = self.pop()?;
                    let v = self.call(f, args)?;
                    self.stack.push(v);
                }
                0x81 => {
                    let args = self.pop()?;
                    let cls = self.pop()?;
                    let v = self.call(cls, args)?;
                    self.stack.push(v);
                }
                0x92 => {
                    let _kw = self.pop()?;
                    let args = self.pop()?;
                    let cls = self.pop()?;
                    let v = self.call(cls, args)?;
                    self.stack.push(v);
                }
                b'o' => {
                    // OBJ
                    let mut v = self.pop_mark()?;
                    if v.is_empty() {
                        return self.bad("OBJ without class");
                    }
                    let cls = v.remove(0);
                    let r = self.call(cls, Value::Tuple(Rc::new(v)))?;
                    self.stack.push(r);
                }
                b'i' => {
                    // INST
                    let module = self.line()?.to_string();
                    let name = self.line()?.to_string();
                    let v = self.pop_mark()?;
                    let r = self.call(Value::Global(Rc::new((module, name))), Value::Tuple(Rc::new(v)))?;
                    self.stack.push(r);
                }
                b'b' => {
                    let state = self.pop()?;
                    self.build(state)?;
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let v = self.persistent(pid)?;
                    self.stack.push(v);
                }
                b'P' => {
                    let s = self.line()?.to_string();
                    self.stack.push(Value::Str(s));
                }
                b'h' => {
                    let k = self.le(1)?;
                    let v = self.memo_get(k)?;
                    self.stack.push(v);
                }
                b'j' => {
                    let k = self.le(4)?;
                    let v = self.memo_get(k)?;
                    self.stack.push(v);
                }
                b'g' => {
                    let k: u64 = self.line()?.parse().unwrap_or(u64::MAX);
                    let v = self.memo_get(k)?;
                    self.stack.push(v);
                }
                b'q' => {
                    let k = self.le(1)?;
                    self.memo_put(k)?;
                }
                b'r' => {
                    let k = self.le(4)?;
                    self.memo_put(k)?;
                }
                b'p' => {
                    let k: u64 = self.line()?.parse().unwrap_or(u64::MAX);
                    self.memo_put(k)?;
                }
                0x94 => {
                    let k = self.memo.len() as u64;
                    self.memo_put(k)?;
                } // MEMOIZE
                _ => return Err(PickleError::Opcode(op, at)),
            }
        }
    }

    fn append(&mut self, items: Vec<Value>) -> Result<(), PickleError> {
        match self.top()? {
            Value::List(l) => {
                l.borrow_mut().extend(items);
                Ok(())
            }
            Value::Object(o) => {
                // list subclasses: keep items in the state under "__items__"
                let mut st = o.state.borrow_mut();
                if !matches!(*st, Value::Dict(_)) {
                    *st = Value::dict(vec![]);
                }
                if let Value::Dict(d) = &*st {
                    d.borrow_mut().push((Value::Str("__items__".into()), Value::list(items)));
                }
                Ok(())
            }
            _ => self.bad("APPEND to a non-list"),
        }
    }

    fn setitems(&mut self, kv: Vec<Value>) -> Result<(), PickleError> {
        if kv.len() % 2 != 0 {
            return self.bad("odd number of dict items");
        }
        let target = match self.top()? {
            Value::Dict(d) => d.clone(),
            Value::Object(o) => {
                // dict subclasses (e.g. an OrderedDict subclass): keep items in the state
                let mut st = o.state.borrow_mut();
                if !matches!(*st, Value::Dict(_)) {
                    *st = Value::dict(vec![]);
                }
                match &*st {
                    Value::Dict(d) => d.clone(),
                    _ => unreachable!(),
                }
            }
            _ => return self.bad("SETITEM on a non-dict"),
        };
        let mut t = target.borrow_mut();
        for c in kv.chunks(2) {
            if let Some(slot) = t.iter_mut().find(|(k, _)| key_eq(k, &c[0])) {
                slot.1 = c[1].clone();
            } else {
                t.push((c[0].clone(), c[1].clone()));
            }
        }
        Ok(())
    }

    fn build(&mut self, state: Value) -> Result<(), PickleError> {
        match self.top()? {
            Value::Object(o) => {
                // BUILD with (dict, slots) tuples: merge both
                let state = match &state {
                    Value::Tuple(t) if t.len() == 2 => match (&t[0], &t[1]) {
                        (Value::Dict(_), Value::None) => t[0].clone(),
                        (Value::None, Value::Dict(_)) => t[1].clone(),
                        (Value::Dict(a), Value::Dict(b)) => {
                            let mut m = a.borrow().clone();
                            m.extend(b.borrow().iter().cloned());
                            Value::dict(m)
                        }
                        _ => state.clone(),
                    },
                    _ => state,
                };
                let mut st = o.state.borrow_mut();
                match (&*st, &state) {
                    (Value::Dict(cur), Value::Dict(new)) => {
                        let new = new.borrow().clone();
                        cur.borrow_mut().extend(new);
                    }
                    _ => *st = state,
                }
                Ok(())
            }
            Value::Dict(d) => {
                if let Value::Dict(new) = state {
                    let new = new.borrow().clone();
                    d.borrow_mut().extend(new);
                }
                Ok(())
            }
            Value::Tensor(_) | Value::List(_) => Ok(()), // tensor/list state (hooks, metadata): not needed
            _ => Ok(()),
        }
    }

    fn persistent(&self, pid: Value) -> Result<Value, PickleError> {
        // torch: ('storage', <StorageType global>, key, location, numel)
        let items = pid.items().unwrap_or_default();
        if items.len() >= 5 && items[0].as_str() == Some("storage") {
            let kind = match &items[1] {
                Value::Global(g) => g.1.clone(),
                Value::Object(o) => o.name.clone(),
                _ => return self.bad("storage without a type"),
            };
            let key = match &items[2] {
                Value::Str(s) => s.clone(),
                Value::Int(i) => i.to_string(),
                _ => return self.bad("storage without a key"),
            };
            let numel = items[4]
                .as_int()
                .filter(|&n| n >= 0)
                .ok_or_else(|| PickleError::Malformed { pos: self.pos, msg: "bad storage size".into() })? as usize;
            return Ok(Value::Storage(Rc::new(StorageRef { kind, key, numel })));
        }
        Ok(Value::Tuple(Rc::new(items)))
    }

    /// Calls a global: a few torch/collections constructors are understood, everything else
    /// becomes an inert `Instance`.
    fn call(&self, f: Value, args: Value) -> Result<Value, PickleError> {
        let Value::Global(g) = &f else {
            return Ok(Value::Object(Rc::new(Instance { module: "?".into(), name: "?".into(), args, state: RefCell::new(Value::None) })));
        };
        let (module, name) = (g.0.as_str(), g.1.as_str());
        let a = args.items().unwrap_or_default();
        match (module, name) {
            ("collections", "OrderedDict") | ("collections", "defaultdict") | ("builtins", "dict") | ("__builtin__", "dict") => {
                Ok(Value::dict(vec![]))
            }
            ("builtins", "set") | ("builtins", "frozenset") | ("__builtin__", "set") | ("builtins", "list") => {
                Ok(Value::list(a.first().and_then(|v| v.items()).unwrap_or_default()))
            }
            ("torch._utils", "_rebuild_tensor_v2") | ("torch._utils", "_rebuild_tensor") => self.rebuild_tensor(&a),
            ("torch._utils", "_rebuild_parameter") | ("torch._utils", "_rebuild_parameter_with_state") => match a.first() {
                Some(t @ Value::Tensor(_)) => Ok(t.clone()),
                _ => self.bad("parameter without a tensor"),
            },
            ("torch._tensor", "_rebuild_from_type_v2") => {
                // (func, type, args, state): apply func to args
                if a.len() < 3 {
                    return self.bad("_rebuild_from_type_v2 needs 3 arguments");
                }
                self.call(a[0].clone(), a[2].clone())
            }
            ("_codecs", "encode") => match a.first() {
                Some(Value::Str(s)) => Ok(Value::Bytes(s.chars().map(|c| c as u32 as u8).collect())),
                _ => Ok(Value::Bytes(vec![])),
            },
            _ => Ok(Value::Object(Rc::new(Instance { module: module.into(), name: name.into(), args, state: RefCell::new(Value::None) }))),
        }
    }

    fn rebuild_tensor(&self, a: &[Value]) -> Result<Value, PickleError> {
        if a.len() < 4 {
            return self.bad("_rebuild_tensor_v2 needs 4 arguments");
        }
        let Value::Storage(storage) = &a[0] else { return self.bad("tensor without storage") };
        let offset =
            a[1].as_int().filter(|&v| v >= 0).ok_or_else(|| PickleError::Malformed { pos: self.pos, msg: "bad tensor offset".into() })?
                as usize;
        let dims =
            |v: &Value| -> Option<Vec<usize>> { v.items()?.iter().map(|x| x.as_int().filter(|&i| i >= 0).map(|i| i as usize)).collect() };
        let (Some(shape), Some(stride)) = (dims(&a[2]), dims(&a[3])) else { return self.bad("bad tensor shape or stride") };
        if shape.len() != stride.len() {
            return self.bad("tensor shape and stride differ in rank");
        }
        Ok(Value::Tensor(Rc::new(TensorRef { storage: storage.as_ref().clone(), offset, shape, stride })))
    }
}

fn key_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Str(x), Value::Str(y)) => x == y,
        (Value::Int(x), Value::Int(y)) => x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // python3 -c "import pickle,collections; print(pickle.dumps({'a': [1, 2.5, 'x'], 'b': collections.OrderedDict(c=None)}, protocol=2))"
    const P2: &[u8] = b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01]q\x02(K\x01G@\x04\x00\x00\x00\x00\x00\x00X\x01\x00\x00\x00xq\x03eX\x01\x00\x00\x00bq\x04ccollections\nOrderedDict\nq\x05)Rq\x06X\x01\x00\x00\x00cq\x07Nsu.";

    #[test]
    fn parses_protocol2_containers() {
        let v = parse(P2).unwrap();
        let a = v.get("a").unwrap().items().unwrap();
        assert_eq!(a[0].as_int(), Some(1));
        assert_eq!(a[1].as_f64(), Some(2.5));
        assert_eq!(a[2].as_str(), Some("x"));
        assert!(matches!(v.get("b").unwrap().get("c"), Some(Value::None)));
    }

    #[test]
    fn truncated_and_garbage_are_errors() {
        for n in 0..P2.len() - 1 {
            assert!(parse(&P2[..n]).is_err(), "prefix {n} parsed");
        }
        assert!(parse(b"\xff\xfe").is_err());
        assert!(parse(b"h\x05.").is_err());
    }
}
